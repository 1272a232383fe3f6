"""The captures a node keeps on its disk: where they live, flattening deep disk chains,
settling staged RAM, removing a capture and collecting the layers nothing stacks on.

A facet of `Runtime` (its base class): the attributes below are the runtime's own, declared
here so this module needs nothing of `runtime.py` (the two would otherwise import each
other).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from workers.node.disk.budget import DiskBudget
from workers.node.foreground import Foreground
from workers.node.runtime.diskroom import VM_EXTRA, fork_need, top_bytes, vm_writes
from workers.node.runtime.layers import MAX_CHAIN_DEPTH, LayerStore
from workers.node.runtime.rampool import RamPool
from workers.node.runtime.ramstage import RamStage
from workers.node.runtime.snapshot import Snapshot
from workers.node.runtime.teardown import Teardowns
from workers.node.runtime.vm import Vm

__all__ = ["CaptureFiles"]

log = logging.getLogger(__name__)


class CaptureFiles:
    state_dir: Path
    layers: LayerStore
    ram_stage: RamStage
    ram_pool: RamPool
    foreground: Foreground
    teardowns: Teardowns
    vms: dict[str, Vm]
    #: the node's disk budget: what VM starts write goes through it (None: not counted)
    disk_budget: DiskBudget | None = None

    async def compact_if_deep(self, snap: Snapshot) -> Snapshot:
        """A snapshot whose disk chain grew past the limit (many pause/resume cycles) gets one
        flattened layer over the base instead; the old layers are left to `collect_layers`."""
        if await self.layers.depth(snap.disk_top) <= MAX_CHAIN_DEPTH:
            return snap
        await self.teardowns.settled(snap.snapshot_id)  # qemu-img waits for QEMU's lock
        flat = await self.layers.compact(snap.disk_top)
        compacted = dataclasses.replace(snap, disk_top=flat)
        compacted.write()
        log.info("snapshot %s: disk chain compacted into %s", snap.snapshot_id, flat.name)
        return compacted

    async def settled(self, snapshot_id: str) -> None:
        """Return once a detached capture's QEMU has exited (its files are then final)."""
        await self.teardowns.settled(snapshot_id)

    async def persist(self, snap: Snapshot) -> None:
        """Put all of a capture's files on the node's disk: a capture of a VM that ran on
        (`capture(resume=True)`) may hold its RAM in memory (`RamStage`). A snapshot that
        must outlive the node process is persisted before anyone is told it exists."""
        await asyncio.to_thread(self.ram_stage.settle, snap.mem, self.foreground.pause_point)

    def delete_snapshot(self, snap: Snapshot) -> None:
        """Remove a snapshot's own files. Its disk layers may still be under a running VM
        or another snapshot: `collect_layers` frees them once nothing needs them. The RAM
        pool's ready copies of its RAM file go too (nothing would take them again)."""
        self.ram_stage.discard(snap.mem)
        self.remove_capture_dir(snap.dir)

    def remove_capture_dir(self, sdir: Path) -> None:
        """Remove a capture's directory, whatever state it is in (a crash's half-written
        one, a stale or spent copy), and the RAM pool's copies of anything in it: every
        removal of a capture goes through here or `delete_snapshot`."""
        self.ram_pool.forget_under(sdir)
        shutil.rmtree(sdir, ignore_errors=True)

    async def collect_layers(self, snapshots: list[Snapshot], *, min_age_s: float = 60) -> int:
        """Delete disk layers that neither a live VM nor one of `snapshots` stacks on.

        Chains are read from the files themselves (qemu-img), so layers made before a node
        restart are judged correctly; a layer younger than `min_age_s` is never touched (a
        restore may be stacking on it right now). Returns how many were deleted.
        """
        roots = {vm.disk_top for vm in self.vms.values()} | {s.disk_top for s in snapshots}
        return len(await self.layers.collect(roots, min_age_s=min_age_s))

    def capturing(
        self, vm: Vm, *, refuse: bool, ram: bool = True, children: int = 0
    ) -> AbstractAsyncContextManager[None]:
        """Room for a capture of `vm` (and a fork's `children`) under the disk budget, and
        what it wrote charged after: reserved by eviction if need be. `refuse=False` (a
        pause: refusing it would lose the user's state) writes over the limit with a
        warning when eviction cannot make the room; else `NoRoom` (`unavailable`) before
        anything is written. `ram=False`: a filesystem-only capture (its disk alone)."""
        if not refuse and self.disk_budget is not None:  # a pause ends its VM
            self.disk_budget.stops_growing(self._vm_dir(vm.vm_id))
        need = fork_need(vm, children) if ram else VM_EXTRA + top_bytes(vm)
        dirs = [self.state_dir / "snapshots", self.layers.root]
        if children:
            dirs.append(self.state_dir / "vms")
        return vm_writes(self.disk_budget, need, dirs, refuse=refuse)

    def _vm_dir(self, vm_id: str) -> Path:
        return self.state_dir / "vms" / vm_id

    @property
    def starts(self) -> list[Path]:
        """Where a VM start writes (`diskroom.vm_writes`): its directory, its top layer."""
        return [self.state_dir / "vms", self.layers.root]

    def snapshot_dir(self, snapshot_id: str) -> Path:
        """Where a snapshot of this node lives (captured here, or pulled from a repository)."""
        return self.state_dir / "snapshots" / snapshot_id
