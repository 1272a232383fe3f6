"""A stack started the way a user starts one (`aenv up` on a data dir of its own), for the
tiers that run microVMs (e2e, reliability): up, the SDK pointed at it while it runs, down
with a leak check, and its log's tail in a failing test's report."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv.cli import read_exports
from aenv.stack.process import free_port

AENV = [sys.executable, "-m", "aenv.cli"]
#: what the SDK reads to find a stack, as `aenv up` exports it
SDK_ENV = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL", "E2B_API_KEY")
#: ... and what it prints for clients that reach it over HTTPS by name (`aenv.tls`)
TLS_ENV = ("E2B_DOMAIN", "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS")


def add_log_tail(report: pytest.TestReport, data_dir: Path, lines: int) -> None:
    """The stack's log (QMP chatter left out) at the end of a failing test's report: the
    data dir is gone with the run, so an intermittent failure in CI is otherwise a bare SDK
    timeout with nothing to go on."""
    log = data_dir / "aenv.log"
    text = log.read_text(errors="replace").splitlines() if log.exists() else []
    text = [ln for ln in text if '"qemu.qmp.' not in ln][-lines:]
    report.sections.append(("aenv.log (tail)", "\n".join(text)))


def not_json_lines(data_dir: Path) -> list[str]:
    """Lines of the stack's log (rotated files too) that are not one JSON object each."""
    bad = []
    for log in sorted(data_dir.glob("aenv.log*")):
        for line in log.read_text(errors="replace").splitlines():
            try:
                if not isinstance(json.loads(line), dict):
                    bad.append(line)
            except ValueError:
                bad.append(line)
    return bad


@contextlib.contextmanager
def running_stack(data: Path, env: dict[str, str], slot_prefix: str) -> Iterator[dict[str, str]]:
    """`aenv up` (the test fails with the log if it does not come up); yields its exports
    with the SDK's settings pointing at it; then `aenv down`, and no process of the stack
    nor network namespace of `slot_prefix` may be left — a node some test SIGKILLed too."""
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
    exports = read_exports(up.stdout)
    saved = {k: os.environ.get(k) for k in SDK_ENV}
    os.environ.update({k: exports[k] for k in SDK_ENV})
    try:
        yield exports
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        down = subprocess.run(
            [*AENV, "down", "--data-dir", str(data)], capture_output=True, text=True, timeout=120
        )
        assert down.returncode == 0, down.stderr
        leftovers = subprocess.run(["pgrep", "-af", str(data)], capture_output=True, text=True)
        assert leftovers.stdout.strip() == "", f"processes left behind: {leftovers.stdout}"
        from workers.node.net import list_leftovers

        assert list_leftovers(slot_prefix) == [], "network namespaces left behind"
