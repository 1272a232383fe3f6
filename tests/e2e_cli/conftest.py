"""A stack of its own for the CLI tests (`aenv up` on a temp dir and free port, slots
`aenvc*`, node `cli`), and `run_aenv`: the CLI as a user runs it, in a subprocess whose
HOME is empty so no credentials file of the machine leaks in."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aenv.stack.process import free_port
from tests.e2e.conftest import AENV
from tests.support import tagged

pytestmark = pytest.mark.vm

# Variables that would point the CLI somewhere else than the stack under test.
_ROUTING = (
    "AENV_API_URL",
    "AENV_API_KEY",
    "E2B_API_URL",
    "E2B_API_KEY",
    "E2B_SANDBOX_URL",
    "AENV_DATA_DIR",
    "XDG_CONFIG_HOME",
)


@dataclass(frozen=True)
class CliStack:
    data_dir: Path
    api_url: str
    api_key: str
    home: Path

    def env(self, **extra: str) -> dict[str, str]:
        """A user's shell after `eval $(aenv up)`: the E2B_* exports and nothing else of ours."""
        base = {k: v for k, v in os.environ.items() if k not in _ROUTING}
        return {
            **base,
            "HOME": str(self.home),
            "E2B_API_URL": self.api_url,
            "E2B_SANDBOX_URL": self.api_url,
            "E2B_API_KEY": self.api_key,
            **extra,
        }

    def bare_env(self, **extra: str) -> dict[str, str]:
        """No routing variables at all: only flags, credentials or stack.json can help."""
        base = {k: v for k, v in os.environ.items() if k not in _ROUTING}
        return {**base, "HOME": str(self.home), **extra}


def run_aenv(
    *args: str, env: dict[str, str], timeout: float = 120, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*AENV, *args], env=env, capture_output=True, timeout=timeout, input=stdin
    )


@pytest.fixture(scope="package")
def cli_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliStack]:
    if os.geteuid() != 0:
        pytest.skip("the stack runs microVMs: needs root")
    data = tmp_path_factory.mktemp("aenv-cli")
    home = tmp_path_factory.mktemp("home")
    env = {
        **os.environ,
        "AENV_SLOT_PREFIX": tagged("aenvc"),
        "AENV_NODE_ID": "cli",
        "AENV_TLS_PORT": str(free_port()),
    }
    up = subprocess.run(
        [*AENV, "up", "--data-dir", str(data), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    if up.returncode != 0:
        log = (data / "aenv.log").read_text(errors="replace")[-4000:]
        pytest.fail(f"aenv up failed ({up.returncode}): {up.stderr[-2000:]}\n--- log\n{log}")
    info = json.loads((data / "stack.json").read_text())
    try:
        yield CliStack(data, info["E2B_API_URL"], info["E2B_API_KEY"], home)
    finally:
        down = subprocess.run(
            [*AENV, "down", "--data-dir", str(data)], capture_output=True, text=True, timeout=120
        )
        assert down.returncode == 0, down.stderr
        leftovers = subprocess.run(["pgrep", "-af", str(data)], capture_output=True, text=True)
        assert leftovers.stdout.strip() == "", f"processes left behind: {leftovers.stdout}"


@pytest.fixture
def sandbox(cli_stack: CliStack) -> Iterator[str]:
    """A detached sandbox started through the CLI; removed afterwards whatever happened."""
    r = run_aenv("start", "-d", "--timeout", "600", env=cli_stack.env())
    assert r.returncode == 0, r.stderr.decode()
    sid = r.stdout.decode().strip()
    try:
        yield sid
    finally:
        run_aenv("rm", sid, env=cli_stack.env())
