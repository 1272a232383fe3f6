"""deploy/install.sh upgrades without touching the venv the services run: each install goes
into a new venv (deploy/venvs.sh), the link the units run is switched in one rename, and a
failed install leaves both as they were. Driven here for real in a temporary prefix, as an
ordinary user and offline: tiny wheels named like aenv's, pip without an index."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.deploy import deploy_files as df
from tests.deploy import release_files as rf


def _wheel(where: Path, version: str) -> Path:
    """aenv_platform-VERSION: an `aenv` command printing `aenv VERSION`, nothing else."""
    info = f"aenv_platform-{version}.dist-info"
    files = {
        "aenv_stub.py": f"def main():\n    print('aenv {version}')\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: aenv-platform\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
        f"{info}/entry_points.txt": "[console_scripts]\naenv = aenv_stub:main\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = where / f"aenv_platform-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def _venvs(prefix: Path, script: str) -> subprocess.CompletedProcess[str]:
    """`script` in bash with venvs.sh's functions, pip offline."""
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PREFIX": str(prefix)}
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; . {rf.VENVS}; {script}"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=240,
    )


def _aenv(venv: Path) -> str:
    return subprocess.run(
        [venv / "bin" / "aenv"], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.slow
def test_each_install_is_a_new_venv_and_the_link_switches(tmp_path: Path) -> None:
    prefix = tmp_path / "opt-aenv"
    pins = tmp_path / "constraints.txt"
    pins.write_text("# nothing to pin: the stub wheels need nothing\n")
    install = 'v=$(new_venv "$PREFIX" "$1" "$2"); switch_current "$PREFIX" "$v"; echo "$v"'

    first = _venvs(prefix, f"set -- {_wheel(tmp_path, '9.1.0')} {pins}; {install}")
    assert first.returncode == 0, first.stderr
    old = Path(first.stdout.strip())
    assert old.parent == prefix / "venvs" and old.name.startswith("9.1.0-")
    assert os.readlink(prefix / "current") == f"venvs/{old.name}"

    second = _venvs(prefix, f"set -- {_wheel(tmp_path, '9.2.0')} {pins}; {install}")
    assert second.returncode == 0, second.stderr
    new = Path(second.stdout.strip())
    assert new != old and new.name.startswith("9.2.0-")
    # the running services' venv is untouched; a (re)start now runs the new one
    assert _aenv(old) == "aenv 9.1.0"
    assert _aenv(prefix / "current") == "aenv 9.2.0"
    assert (prefix / "current").is_symlink() and not (prefix / "current.new").exists()
    assert not list(old.glob("venvs*")) and not list(new.glob("venvs*")), "ln into the old dir"

    # Debian without python3-venv: `python3 -m venv` makes the directory, then fails on
    # ensurepip. (A python3 that does just that: a real one would cost another 5 s.)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "python3").write_text('#!/bin/sh\nmkdir -p "$3/bin"; echo "no ensurepip" >&2; exit 1\n')
    (shim / "python3").chmod(0o755)
    failed = _venvs(
        prefix, f"PATH={shim}:$PATH; set -- {_wheel(tmp_path, '9.3.0')} {pins}; {install}"
    )
    assert failed.returncode != 0 and "no ensurepip" in failed.stderr
    assert sorted(p.name for p in (prefix / "venvs").iterdir()) == sorted([old.name, new.name])
    assert _aenv(prefix / "current") == "aenv 9.2.0"


def test_prune_keeps_the_newest_and_the_current(tmp_path: Path) -> None:
    prefix = tmp_path / "opt-aenv"
    names = ["0.9.0-a", "1.0.0-b", "1.1.0-c", "1.2.0-d"]
    for age, name in enumerate(reversed(names)):  # 1.2.0-d newest
        (prefix / "venvs" / name).mkdir(parents=True)
        os.utime(prefix / "venvs" / name, (1e9 - age * 60, 1e9 - age * 60))
    # the current venv is an old one (a roll back): it stays, whatever its age
    proc = _venvs(
        prefix, 'switch_current "$PREFIX" "$PREFIX/venvs/0.9.0-a"; prune_venvs "$PREFIX" 2'
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (prefix / "venvs").iterdir()) == ["0.9.0-a", "1.1.0-c", "1.2.0-d"]


def test_version_of_a_checkout_and_a_wheel(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "aenv-platform"\nversion = "3.4.5"\n'
    )
    proc = _venvs(
        tmp_path, f"source_version {tmp_path}; source_version /x/aenv_platform-6.7-py3-none-any.whl"
    )
    assert proc.stdout.split() == ["3.4.5", "6.7"], proc.stderr


def test_install_switches_only_after_the_new_venv_works() -> None:
    """The order of install.sh: new venv, its checks, units, the switch, then restarts."""
    text = rf.INSTALL.read_text()
    steps = [
        'new_venv "$PREFIX"',
        '"$NEW/bin/aenv" --version',
        "get_heads()",
        'rm -rf "$NEW"',
        'switch_current "$PREFIX" "$NEW"',
        'prune_venvs "$PREFIX" "$KEEP"',
        'systemctl restart "${units[@]}"',
    ]
    at = [text.index(step) for step in steps]
    assert at == sorted(at), steps
    units = [df.SYSTEMD / "aenv-api.service", df.SYSTEMD / "aenv-node.service"]
    for unit in units:
        (start,) = df.unit_values(unit.read_text(), "ExecStart")
        assert start.startswith("/opt/aenv/current/bin/aenv "), unit


@pytest.mark.parametrize(
    "script", [rf.VENVS, rf.SETUP, rf.SETUP.parent / "dist.sh"], ids=lambda p: p.name
)
def test_release_scripts_pass_bash_n_and_shellcheck(script: Path) -> None:
    assert df.shell_problems(script) == []


@pytest.mark.parametrize("keep", ["1", "two"])
def test_install_refuses_to_keep_fewer_than_two_venvs(keep: str) -> None:
    proc = subprocess.run(
        ["bash", str(rf.INSTALL), "--keep", keep], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and "--keep must be" in proc.stderr
