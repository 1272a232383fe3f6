"""Captures under one disk budget, with real microVMs (issue 42): a pause under a budget
too tight for it evicts a regenerable entry (a repository blob cache file) to make its
room, and the ledger counts at least what is on disk after it; a pause that not even
eviction can make room for goes ahead all the same (losing it would lose the user's
state), with a warning. A fork too big for the budget is refused `unavailable` before its
capture: no child, no capture, no layer left behind, and the parent runs on. A template
build refused for disk, at its boot or at its capture, fails `unavailable` naming the
budget and leaves nothing."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from tests.integration.disk.conftest import boot_template
from tests.support import tagged
from workers.node.disk import STATE, scan
from workers.node.disk.budget import DiskBudget, NoRoom
from workers.node.disk.evict import Entry
from workers.node.image import GuestImage
from workers.node.runtime import Runtime, Snapshot, Vm
from workers.node.runtime.diskroom import boot_need, capture_need, fork_need, top_bytes
from workers.node.templates import TemplateCatalog, TemplateSpec

pytestmark = [pytest.mark.vm, pytest.mark.slow, pytest.mark.timeout(900)]

MiB = 1 << 20
PREFIX = tagged("aenvc")
HEADROOM = 64 * MiB
MEM_MIB = 256


@pytest.fixture(scope="module")
async def template(runtime: Runtime, guest_image: GuestImage) -> Snapshot:
    return await boot_template(runtime, guest_image, MEM_MIB)


async def _sandbox(runtime: Runtime, template: Snapshot) -> Vm:
    """A sandbox as a create starts it: its own RAM file (it may pause). The RAM pool's
    copies of the template go after it, so that nothing else is there to evict."""
    vm, _ = await runtime.restore(template, private_memory=False)
    await runtime.ram_pool.idle()
    runtime.ram_pool.forget(template.mem)
    await runtime.ram_pool.idle()
    assert not runtime.ram_pool.ready_files()
    return vm


async def _pause(runtime: Runtime, vm: Vm) -> Snapshot:
    """`SandboxHost.pause`'s runtime steps: never refused for disk."""
    async with runtime.capturing(vm, refuse=False):
        snap = await runtime.capture(vm, resume=False, detach=True)
        return await runtime.compact_if_deep(snap)


def _old_blob(state: Path, size: int) -> Path:
    """A repository blob cache file last used long ago: the first thing eviction takes."""
    blob = state / "blob-cache" / ("ab" * 32)
    blob.parent.mkdir(parents=True, exist_ok=True)
    with open(blob, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, size)
    os.utime(blob, (1000, 1000))
    return blob


def _on_disk(runtime: Runtime) -> int:
    return scan([(STATE, runtime.state_dir)]).total


async def test_a_pause_evicts_to_make_its_room_and_is_charged(
    runtime: Runtime, template: Snapshot, budget: DiskBudget, evicted: list[Entry]
) -> None:
    vm = await _sandbox(runtime, template)
    need = capture_need(vm.machine.mem_mib, top_bytes(vm))
    blob = _old_blob(runtime.state_dir, 200 * MiB)
    budget.walk()
    budget.budget = budget.used() + HEADROOM + need - 100 * MiB  # short by 100 MiB
    snap = await _pause(runtime, vm)
    assert not blob.exists(), "the blob cache's file was evicted to make the pause's room"
    assert [e.category for e in evicted] == ["blob_cache"]
    assert (snap.dir / "manifest.json").is_file() and snap.mem.is_file()
    assert budget.reserved() == 0
    assert budget.accounted() >= _on_disk(runtime)
    await runtime.teardowns.drain()  # the paused VM's QEMU exits in the background
    assert budget.accounted() >= _on_disk(runtime)
    assert budget.accounted() <= budget.limit


async def test_a_pause_with_no_room_at_all_goes_ahead_with_a_warning(
    runtime: Runtime,
    template: Snapshot,
    budget: DiskBudget,
    evicted: list[Entry],
    caplog: pytest.LogCaptureFixture,
) -> None:
    vm = await _sandbox(runtime, template)
    budget.walk()
    budget.budget = budget.used() + HEADROOM  # not a byte free
    with caplog.at_level(logging.WARNING):
        snap = await _pause(runtime, vm)
    assert "over the budget, written anyway" in caplog.text
    assert (snap.dir / "manifest.json").is_file()
    assert not evicted
    await runtime.teardowns.drain()
    assert budget.accounted() >= _on_disk(runtime)


async def test_a_fork_too_big_for_the_budget_is_refused_whole(
    runtime: Runtime, template: Snapshot, budget: DiskBudget
) -> None:
    parent = await _sandbox(runtime, template)
    try:
        budget.walk()
        # room for the capture and a few children, not for sixteen
        held = budget.reserved()  # what the running parent may still grow to
        budget.budget = budget.used() + held + HEADROOM + fork_need(parent, 4)
        dirs = [runtime.state_dir / d for d in ("vms", "snapshots", "layers")]
        before = {d: sorted(os.listdir(d)) for d in dirs}
        vms_before = set(runtime.vms)
        with pytest.raises(NoRoom) as refused:
            await runtime.fork(parent, 16)
        assert refused.value.code == "unavailable"
        assert str(refused.value).startswith("node disk budget: need ")
        assert {d: sorted(os.listdir(d)) for d in dirs} == before  # nothing left behind
        assert set(runtime.vms) == vms_before
        assert budget.reserved() == held
        assert parent.qemu.alive
        assert await asyncio.wait_for(parent.qemu.status(), 30) == "running"
    finally:
        await runtime.destroy(parent)


async def test_a_template_build_that_cannot_fit_fails_unavailable_and_leaves_nothing(
    runtime: Runtime, budget: DiskBudget
) -> None:
    catalog = TemplateCatalog(runtime, base=TemplateSpec("base", mem_mib=MEM_MIB))
    dirs = [runtime.state_dir / d for d in ("vms", "snapshots", "layers")]
    before = {d: sorted(os.listdir(d)) for d in dirs}
    budget.walk()
    budget.budget = budget.used() + HEADROOM  # no room to boot it
    with pytest.raises(NoRoom) as refused:
        await catalog.get("base")
    assert refused.value.code == "unavailable"
    assert str(refused.value).startswith("template 'base' could not be built: node disk budget")
    assert {d: sorted(os.listdir(d)) for d in dirs} == before
    # room to boot it, not to capture it: the booted VM goes with the refusal
    budget.budget = budget.used() + HEADROOM + boot_need(MEM_MIB) + 32 * MiB
    with pytest.raises(NoRoom, match="could not be built: node disk budget"):
        await catalog.get("base")
    await runtime.teardowns.drain()
    assert {d: sorted(os.listdir(d)) for d in dirs} == before
    assert budget.reserved() == 0
    assert catalog.ready("base") is None
