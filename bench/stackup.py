"""`aenv up` for a bench run: the one way benches start a stack of their own and read what
it exports (the tests have theirs in `tests/vmstack.py`, failing the test instead)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from aenv.cli import read_exports
from aenv.stack.process import free_port

#: The CLI as this interpreter runs it (the bench's venv, not whatever `aenv` is on PATH)
AENV = [sys.executable, "-m", "aenv.cli"]


def aenv_up(data: Path, env: dict[str, str], *, timeout: float) -> dict[str, str]:
    """`aenv up` on `data` with `env`, on a free port; the exports it printed. A stack that
    does not come up ends the bench with its stderr's tail."""
    up = subprocess.run(
        [*AENV, "up", "--data-dir", str(data), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if up.returncode != 0:
        raise SystemExit(f"aenv up failed ({up.returncode}): {up.stderr[-2000:]}")
    return read_exports(up.stdout)
