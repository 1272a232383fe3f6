"""`aenv --version` says the distribution's version: the installed metadata's, else the
source tree's pyproject.toml (a checkout run from PYTHONPATH)."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aenv import version as version_module
from aenv.cli import app

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def test_version_option_prints_the_pyproject_version() -> None:
    want = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0, r.output
    assert r.output == f"aenv {want}\n"


def test_installed_metadata_comes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def installed(name: str) -> str:
        asked.append(name)
        return "9.8.7"

    monkeypatch.setattr(metadata, "version", installed)
    assert version_module.version() == "9.8.7"
    assert asked == ["aenv-platform"]


def test_no_metadata_and_no_pyproject_is_unknown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    monkeypatch.setattr(version_module, "_PYPROJECT", tmp_path / "pyproject.toml")
    assert version_module.version() == "unknown"
