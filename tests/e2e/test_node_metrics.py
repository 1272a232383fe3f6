"""The node's series with real microVMs (issue 20): what its QEMU processes cost (RSS, CPU)
while a sandbox runs, the restore and envd stages of a real create, and a VM that dies
unasked — its QEMU SIGKILLed — counted as a crash, while the sandbox is killed as lost."""

from __future__ import annotations

import json
import os
import signal

import pytest
from e2b import Sandbox, SandboxNotFoundException

from bus import BusSettings
from tests.e2e.conftest import Stack
from tests.series import Samples, node_url, scrape
from tests.support import eventually_sync

pytestmark = pytest.mark.vm

NODE = "e2e"


def _scrape(stack: Stack) -> Samples:
    token = json.loads((stack.data_dir / "stack.json").read_text())["metrics_token"]
    return scrape(node_url(BusSettings(nats_url=stack.nats_url), NODE), token)


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return _value(after, name, **labels) - _value(before, name, **labels)


def _qemu_of(stack: Stack, sandbox_id: str) -> int:
    """The pid of the sandbox's QEMU (its VM directory says: restored for it or a warm VM
    handed over, whose command line names the directory it started in)."""
    return int((stack.data_dir / "node" / "vms" / sandbox_id / "qemu.pid").read_text())


def test_vm_cost_stages_and_a_crash(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in stack.env().items():
        monkeypatch.setenv(k, v)
    before = _scrape(stack)
    sbx = Sandbox.create(timeout=300)
    sbx.commands.run("sh -c 'i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done'")
    running = _scrape(stack)
    assert _value(running, "aenv_node_vms", node=NODE) >= 1
    rss = _value(running, "aenv_node_vm_rss_bytes", node=NODE)
    assert rss > 32 << 20, rss  # a QEMU with a guest in it: tens of MiB at least
    cpu_before = _value(before, "aenv_node_vm_cpu_seconds_total", node=NODE)
    assert _value(running, "aenv_node_vm_cpu_seconds_total", node=NODE) > cpu_before
    # restored cold, or handed over by the warm pool: one observation of each stage
    for stage in ("queue", "restore", "envd_ready", "total"):
        n = sum(
            _delta(
                before,
                running,
                "aenv_lifecycle_seconds_count",
                op="create",
                stage=stage,
                start=start,
            )
            for start in ("cold", "warm")
        )
        assert n == 1, (stage, n)
    restore_s = sum(
        _delta(
            before, running, "aenv_lifecycle_seconds_sum", op="create", stage="restore", start=start
        )
        for start in ("cold", "warm")
    )
    assert 0 < restore_s < 60

    os.kill(_qemu_of(stack, sbx.sandbox_id), signal.SIGKILL)  # dies unasked: no OOM, a crash

    def counted() -> Samples | None:
        s = _scrape(stack)
        crashes = _value(s, "aenv_vm_deaths_total", cause="crash") - _value(
            before, "aenv_vm_deaths_total", cause="crash"
        )
        return s if crashes == 1 else None

    after = eventually_sync(counted, timeout=30, interval=0.5)
    assert _value(after, "aenv_vm_deaths_total", cause="oom") == _value(
        before, "aenv_vm_deaths_total", cause="oom"
    )

    def gone() -> bool:  # killed as lost: E2B's clients no longer find it
        try:
            Sandbox.get_info(sbx.sandbox_id)
        except SandboxNotFoundException:
            return True
        return False

    eventually_sync(gone, timeout=30)
