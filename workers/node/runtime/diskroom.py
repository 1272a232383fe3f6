"""What a VM start writes, under the node's disk budget: room reserved before a restore or
a boot (its RAM file, its directory, its fresh top layer), and what they left charged after
(`produced.writing_async` over `vms/` and `layers/`). A running VM grows its RAM file and
top layer without asking: what its directory may still add, up to its guest's RAM, stays
reserved while it runs (`DiskBudget.grows`); the budget's headroom is for the rest (a top
layer past that).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from workers.node.disk.budget import DiskBudget
from workers.node.disk.produced import writing_async
from workers.node.runtime.memfile import allocated_bytes
from workers.node.runtime.snapshot import Snapshot

__all__ = ["VM_EXTRA", "boot_room", "restore_need", "restore_room", "vm_writes"]

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


@asynccontextmanager
async def vm_writes(
    budget: DiskBudget | None, need: int, grows: int, dirs: Sequence[Path]
) -> AsyncIterator[None]:
    """`need` bytes reserved (`NoRoom`: the start fails `unavailable`, placement goes
    elsewhere) and what appeared in `dirs` charged after; then each new VM directory
    (in `dirs[0]`, `vms/`) may grow to `grows` while it is there. Nothing without a budget."""
    if budget is None:
        yield
        return
    before = set(_names(dirs[0]))
    async with writing_async(budget, need, dirs):
        yield
    for name in set(_names(dirs[0])) - before:  # a start beside it too: the same cap, twice
        budget.grows(dirs[0] / name, grows)


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []
