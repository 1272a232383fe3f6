"""Ending VMs: the kill and the cleanup after it, and the releases still under way.

A pause returns once the VM's state is on disk; its QEMU's exit and its network slot's
teardown go on after (`release`), because they cost more than the capture and nobody waits
for them — except a restore of that same capture, which must wait for the exit (QEMU holds
the frozen layer's write lock until then: `take_release`). The runtime keeps one of these
and delegates; the VM table stays the runtime's and is shared here.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from collections.abc import Callable

from workers.node.disk.budget import DiskBudget
from workers.node.foreground import in_background
from workers.node.net import SlotPool
from workers.node.runtime.vm import Vm

__all__ = ["Teardowns"]


class Teardowns:
    """The VMs being ended, keyed by the capture they leave (releases) or not (teardowns)."""

    def __init__(
        self,
        vms: dict[str, Vm],
        pool: SlotPool,
        budget: Callable[[], DiskBudget | None] = lambda: None,
    ) -> None:
        self.vms = vms
        self.pool = pool
        #: the node's disk budget: a deleted VM directory leaves its tally at once
        self.budget = budget
        self._releasing: dict[str, asyncio.Task[None]] = {}
        self._teardowns: set[asyncio.Task[None]] = set()

    async def drain(self) -> None:
        """Wait for every release and teardown under way (the runtime's close)."""
        if self._releasing:
            await asyncio.wait(set(self._releasing.values()))
        if self._teardowns:
            await asyncio.wait(set(self._teardowns))

    def release_for(self, snapshot_id: str, vm: Vm) -> None:
        """End a captured VM in the background, remembered under its capture's id."""
        task = asyncio.create_task(self.release(vm), name=f"release:{vm.vm_id}")
        self._releasing[snapshot_id] = task
        # once QEMU is gone nobody needs to wait: a snapshot never restored (its sandbox
        # killed while paused) must not keep an entry for the node's life
        task.add_done_callback(lambda _: self._releasing.pop(snapshot_id, None))

    def release_later(self, vm: Vm) -> None:
        """End a consumed VM in the background, with nothing to wait for it by."""
        self._track(asyncio.create_task(self.release(vm), name=f"release:{vm.vm_id}"))

    async def settled(self, snapshot_id: str) -> None:
        """Return once a detached capture's QEMU has exited (its files are then final)."""
        releasing = self._releasing.get(snapshot_id)
        if releasing is not None:
            await asyncio.wait({releasing})

    async def take_release(self, snapshot_id: str) -> None:
        """A restore of `snapshot_id` is about to start: its paused VM's QEMU must be gone."""
        releasing = self._releasing.pop(snapshot_id, None)
        if releasing is not None:
            await asyncio.wait({releasing})

    async def release(self, vm: Vm) -> None:
        """End a captured VM's QEMU. SIGKILL, not `quit`: the migration to the state file
        completed, which stopped the guest and flushed and released its disks, and its RAM
        is a shared file mapping (the kernel keeps every written page). A graceful quit
        only adds tens of milliseconds that a quick resume would wait for — as would the
        network slot's teardown, which therefore goes on after this returns."""
        try:
            await vm.qemu.kill()
        finally:
            # The sandbox's resume reuses its id (and so its directory): make both ours
            # before returning, then tear down the rest in the background.
            if self.vms.get(vm.vm_id) is vm:
                del self.vms[vm.vm_id]
            with contextlib.suppress(OSError):
                gone = vm.dir.with_name(f"{vm.dir.name}.gone-{uuid.uuid4().hex[:8]}")
                vm.dir.rename(gone)
                vm.dir = gone
            self._track(
                asyncio.create_task(self.destroy(vm, background=True), name=f"teardown:{vm.vm_id}")
            )

    async def destroy(self, vm: Vm, *, background: bool = False) -> None:
        """Kill the VM and free its slot, directory and unfrozen layers. Idempotent.
        `background`: nobody waits for the rest once QEMU is gone (a paused VM's release),
        so it is housekeeping: after the restores in flight, at the lowest priority."""
        if self.vms.get(vm.vm_id) is vm:  # not a newer VM that reuses the id (a resume)
            del self.vms[vm.vm_id]
        await vm.qemu.kill()
        if vm.slot.lock_fd is not None:
            await self.pool.release(vm.slot, background=background)
        for layer in vm.owned_layers:
            layer.unlink(missing_ok=True)
        vm.owned_layers = []
        if background:
            await in_background(shutil.rmtree, vm.dir, True)
        else:
            shutil.rmtree(vm.dir, ignore_errors=True)
        if (budget := self.budget()) is not None:
            budget.gone(vm.dir)

    def _track(self, task: asyncio.Task[None]) -> None:
        self._teardowns.add(task)
        task.add_done_callback(self._teardowns.discard)
