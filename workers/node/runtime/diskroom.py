"""What a VM start or capture writes, under the node's disk budget: room reserved before a
restore or a boot (its RAM file, its directory, its fresh top layer) or a capture (its RAM,
its device state, a compacted chain), and what they left charged after
(`produced.writing_async` over the directories they write into). A running VM grows its RAM
file and top layer without asking: what its directory may still add, up to its guest's RAM,
stays reserved while it runs (`DiskBudget.grows`); the budget's headroom is for the rest (a
top layer past that).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from workers.node.disk.budget import DiskBudget
from workers.node.disk.produced import names, writing_async
from workers.node.runtime.memfile import allocated_bytes
from workers.node.runtime.snapshot import Snapshot
from workers.node.runtime.vm import Vm

__all__ = [
    "VM_EXTRA",
    "boot_need",
    "boot_room",
    "capture_need",
    "fork_need",
    "restore_need",
    "restore_room",
    "top_bytes",
    "vm_start",
    "vm_writes",
]

#: a VM start's writes beside its RAM file: the top layer's first clusters, the console
#: log, QEMU's sockets and pid file (a guess with room to spare; the charge is measured)
VM_EXTRA = 16 << 20


def restore_need(snap: Snapshot, *, private: bool) -> int:
    """Room a restore of `snap` takes: a VM of its own RAM file gets a copy of the
    capture's (or, resuming a pause, the capture keeps a copy of the one the VM adopts):
    its allocated bytes; a fork's child maps it copy-on-write (no file). RAM carried in
    the state stream fills a file as large as the stream."""
    if private:
        return VM_EXTRA
    ram = snap.state if snap.ram_in_state else snap.mem
    try:
        return VM_EXTRA + allocated_bytes(ram)
    except OSError:  # not there: the restore fails on it, not on its room
        return VM_EXTRA


def restore_room(snap: Snapshot, private: bool) -> tuple[int, int]:
    """A restore's (`need`, `grows`) for `vm_writes`: a VM of its own RAM file may fill it
    to the guest's RAM; a fork's child (copy-on-write, no file) only its directory. The
    room is made for all of it before the start: a VM that fills its RAM file after its
    start cannot be refused then (the catalogue went 84 MiB over its budget that way)."""
    grows = VM_EXTRA if private else VM_EXTRA + (snap.machine.mem_mib << 20)
    return max(restore_need(snap, private=private), grows), grows


def boot_room(snap: Snapshot) -> tuple[int, int]:
    """A cold boot's: the guest's RAM, which its RAM file may fill."""
    grows = VM_EXTRA + (snap.machine.mem_mib << 20)
    return grows, grows


def boot_need(mem_mib: int) -> int:
    """Room a cold boot takes: its fresh top layer and directory, and a quarter of its
    RAM file (what a booted guest has touched; the rest grows under the headroom)."""
    return VM_EXTRA + (mem_mib << 18)


def capture_need(mem_mib: int, top_allocated: int) -> int:
    """Room a capture takes, high rather than low: all of the guest's RAM (a pause's RAM
    file moved into the capture, or a running VM's copied; a copy-on-write child's carried
    in its state stream), its top layer's allocated bytes again (a chain past the depth
    limit is compacted into a new layer) and `VM_EXTRA` (the device state beside the RAM,
    the fresh top a running VM goes on over)."""
    return VM_EXTRA + (mem_mib << 20) + top_allocated


def fork_need(vm: Vm, children: int) -> int:
    """Room a fork takes, all of it reserved before its capture: the capture and each
    child's directory and top layer (children map the capture's RAM: no file of their
    own)."""
    return capture_need(vm.machine.mem_mib, top_bytes(vm)) + children * VM_EXTRA


def top_bytes(vm: Vm) -> int:
    """The VM's top layer's allocated bytes (0 if gone: the capture fails on it, not here)."""
    try:
        return allocated_bytes(vm.disk_top)
    except OSError:
        return 0


@asynccontextmanager
async def vm_writes(
    budget: DiskBudget | None,
    need: int,
    dirs: Sequence[Path],
    *,
    grows: int = 0,
    refuse: bool = True,
) -> AsyncIterator[None]:
    """`need` bytes reserved (`NoRoom`: the start fails `unavailable`, placement goes
    elsewhere) and what appeared in `dirs` charged after; nothing without a budget.
    `grows`: each new VM directory (in `dirs[0]`, `vms/`) may grow to that while it is
    there. `refuse=False`: written over the limit if eviction cannot make the room (a pause)."""
    if budget is None:
        yield
        return
    before = names(dirs[0]) if grows else set()
    async with writing_async(budget, need, dirs, refuse=refuse):
        yield
        # measured before the charge (which is no less): what `DiskBudget.gone` takes
        # back at a kill is never more than the tally counted
        for name in names(dirs[0]) - before if grows else ():  # a start beside: twice
            budget.grows(dirs[0] / name, grows)


def vm_start(
    budget: DiskBudget | None, room: tuple[int, int], dirs: Sequence[Path]
) -> AbstractAsyncContextManager[None]:
    """`vm_writes` of a VM start's (`need`, `grows`): `restore_room`, `boot_room`."""
    return vm_writes(budget, room[0], dirs, grows=room[1])
