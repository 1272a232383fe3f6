"""What a capture writes goes through the node's disk budget (issue 42), on real files: a
pause is never refused (over the limit it goes ahead with a warning, its reservation held
and what it wrote charged), a refusable write that cannot fit raises `unavailable`; a
capture reserves all of the guest's RAM and its top layer, a fork every child's room too."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from workers.node.disk import STATE, DiskUsage, scan
from workers.node.disk.budget import DiskBudget, NoRoom
from workers.node.disk.evictor import CacheEvictor
from workers.node.disk.produced import METADATA, writing
from workers.node.runtime.diskroom import VM_EXTRA, boot_need, capture_need, fork_need

MiB = 1 << 20


def _budget(state: Path, budget: int) -> DiskBudget:
    return DiskBudget(DiskUsage(state, None), budget, headroom=0, evictor=CacheEvictor(None, state))


def test_a_pause_over_the_budget_is_written_anyway_and_charged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    snapshots = state / "snapshots"
    snapshots.mkdir(parents=True)
    b = _budget(state, 4 * MiB)
    with pytest.raises(NoRoom) as refused:
        b.reserve(8 * MiB).__enter__()
    assert refused.value.code == "unavailable"
    assert b.reserved() == 0
    with caplog.at_level(logging.WARNING), writing(b, 8 * MiB, [snapshots], refuse=False) as r:
        assert b.reserved() == 8 * MiB  # held all the same: the next writer finds no room
        assert b.free() == 0
        (snapshots / "p1").mkdir()
        (snapshots / "p1" / "mem").write_bytes(os.urandom(6 * MiB))
    assert "over the budget, written anyway: node disk budget: need 8 MiB" in caplog.text
    assert r.charged >= 6 * MiB + METADATA
    assert b.reserved() == 0
    assert b.used() >= scan([(STATE, state)]).total  # high, never low


def test_a_capture_reserves_all_its_ram_and_its_top_layer(tmp_path: Path) -> None:
    top = tmp_path / "top.qcow2"
    top.write_bytes(os.urandom(3 * MiB))
    vm = SimpleNamespace(machine=SimpleNamespace(mem_mib=512), disk_top=top)
    one = capture_need(512, os.stat(top).st_blocks * 512)
    assert one == VM_EXTRA + 512 * MiB + os.stat(top).st_blocks * 512
    assert fork_need(vm, 0) == one  # type: ignore[arg-type]
    assert fork_need(vm, 16) == one + 16 * VM_EXTRA  # type: ignore[arg-type]
    top.unlink()  # gone: the capture fails on it, not on its room
    assert fork_need(vm, 1) == VM_EXTRA + 512 * MiB + VM_EXTRA  # type: ignore[arg-type]
    assert boot_need(512) == VM_EXTRA + 128 * MiB
