"""The release: `make dist` builds the wheel and sdist of `aenv-platform` (not `aenv`, an
unrelated project on PyPI) with SHA256SUMS; LICENSE is the Apache-2.0 text pyproject.toml
names; CHANGELOG.md has its Unreleased section."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.deploy.settings_names import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_distribution_name_is_not_pypis_aenv() -> None:
    assert PROJECT["name"] == "aenv-platform"
    assert PROJECT["scripts"] == {"aenv": "aenv.cli:main"}


def test_license_is_the_apache_2_text() -> None:
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text) > 10_000


def test_changelog_has_an_unreleased_section() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n") and "\n## Unreleased\n" in text


def _sums(dist: Path) -> dict[str, str]:
    lines = (dist / "SHA256SUMS").read_text().splitlines()
    return {name.lstrip("*"): digest for digest, name in (line.split(None, 1) for line in lines)}


@pytest.mark.slow
def test_make_dist_builds_wheel_sdist_and_checksums(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "dist.sh")],
        env={**os.environ, "DIST": str(dist)},
        capture_output=True,
        text=True,
        check=False,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    version = PROJECT["version"]
    wheel = dist / f"aenv_platform-{version}-py3-none-any.whl"
    sdist = dist / f"aenv_platform-{version}.tar.gz"
    assert sorted(p.name for p in dist.iterdir()) == sorted(["SHA256SUMS", wheel.name, sdist.name])
    sums = _sums(dist)
    assert sums == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (wheel, sdist)}
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=dist, capture_output=True)
    assert check.returncode == 0, check.stdout

    info = f"aenv_platform-{version}.dist-info"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(f"{info}/METADATA").decode()
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    assert f"Name: aenv-platform\nVersion: {version}\n" in meta
    assert "License-Expression: Apache-2.0" in meta
    assert f"{info}/licenses/LICENSE" in names
    assert "[console_scripts]\naenv = aenv.cli:main" in entry_points
    tops = {n.split("/")[0] for n in names}
    assert {
        "aenv",
        "api",
        "bus",
        "domain",
        "projections",
        "shared",
        "workers",
        "migrations",
    } <= tops
    assert "aenv/version.py" in names and any(n.startswith("migrations/versions/") for n in names)

    with tarfile.open(sdist) as t:
        members = {m.split("/", 1)[1] for m in t.getnames() if "/" in m}
    for needed in (
        "pyproject.toml",
        "LICENSE",
        "CHANGELOG.md",
        "constraints.txt",
        "alembic.ini",
        "deploy/install.sh",
        "deploy/venvs.sh",
        "deploy/versions.env",
    ):
        assert needed in members, needed
    assert "deploy/compose/.env" not in members
