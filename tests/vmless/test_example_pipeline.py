"""examples/pipeline.py run as a user runs it (a subprocess with the stack's NATS, bus
prefix and E2B settings) against the VM-less stack: its creates went over NATS, its audit
of one rollout found the log and the read model in agreement, running and killed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.vmless.conftest import NATS_URL, VmlessStack

ROOT = Path(__file__).resolve().parents[2]


def run_example(vmless: VmlessStack, python: str, n: int, **env: str) -> dict[str, object]:
    """examples/pipeline.py with `python`, against this stack; its JSON line."""
    done = subprocess.run(
        [python, str(ROOT / "examples" / "pipeline.py"), str(n)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT / "examples",
        env={
            **os.environ,
            "AENV_NATS_URL": NATS_URL,
            "AENV_BUS_PREFIX": vmless.bus_settings.bus_prefix,
            "E2B_API_URL": vmless.api_url,
            "E2B_API_KEY": vmless.api_key,
            **env,
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def check(out: dict[str, object], n: int) -> None:
    sandboxes = out["sandboxes"]
    assert isinstance(sandboxes, list) and len(set(sandboxes)) == n, out
    assert out["audit_running"] == [] and out["audit_killed"] == [], out
    history = out["history"]
    assert isinstance(history, list)
    assert [h["type"] for h in history] == [
        "SandboxRequested",
        "SandboxCreated",
        "SandboxKillRequested",
        "SandboxKilled",
    ]
    assert out["run_events"] == 4 * n  # the run's whole history: every sandbox's four


def test_the_pipeline_example_creates_over_nats_and_audits_a_rollout(vmless: VmlessStack) -> None:
    # the client from this tree (a user installs it: `pip install ./clients/python`)
    out = run_example(vmless, sys.executable, 4, PYTHONPATH=str(ROOT))
    check(out, 4)
    sandboxes = out["sandboxes"]
    assert isinstance(sandboxes, list)
    with vmless.client() as c:  # all gone
        for sid in sandboxes:
            assert c.get(f"/sandboxes/{sid}").status_code == 404
