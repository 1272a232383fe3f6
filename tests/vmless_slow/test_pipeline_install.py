"""The pipeline client installs alone and drives a stack: `clients/python` into a fresh
venv (pip, the versions constraints.txt pins, from the index), nothing of the server's
packages or dependencies in it, and examples/pipeline.py run with that venv's Python
against the VM-less stack. Slow: a venv and an install take 15-30 s."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vmless.conftest import VmlessStack
from tests.vmless.test_example_pipeline import check, run_example

ROOT = Path(__file__).resolve().parents[2]
#: what the client may bring: itself, its two dependencies and theirs
ALLOWED = {
    "aenv-pipeline",
    "nats-py",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-extensions",
    "typing-inspection",
    "pip",
    "setuptools",
}


@pytest.mark.slow
def test_the_client_installs_alone_and_drives_a_stack(vmless: VmlessStack, tmp_path: Path) -> None:
    source = tmp_path / "client"  # a copy: the build writes into its source directory
    shutil.copytree(ROOT / "clients" / "python", source, symlinks=False)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    pip = subprocess.run(
        [python, "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]

    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
    ).stdout
    names = {line.split("==")[0].lower().replace("_", "-") for line in listed.split()}
    assert names <= ALLOWED, names - ALLOWED
    probe = (
        "import importlib.util, aenv_pipeline\n"
        "print(aenv_pipeline.__file__)\n"
        "print([m for m in ('bus', 'domain', 'api', 'litestar', 'sqlalchemy')"
        " if importlib.util.find_spec(m)])\n"
        "print(len(aenv_pipeline.schema()['commands']))\n"
    )
    out = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout.splitlines()
    assert out[0].startswith(str(venv)), out  # the installed copy, not this tree
    assert out[1] == "[]", out  # none of the server's packages or its dependencies
    assert int(out[2]) > 0  # the wire schema travelled with it

    check(run_example(vmless, python, 3), 3)
