"""What a VM start writes, under the node's disk budget: room reserved before a restore or
a boot (its RAM file, its directory, its fresh top layer), and what they left charged after
(`produced.writing_async` over `vms/` and `layers/`). Running VMs grow their top layer and
RAM file without asking: the budget's headroom is for that, not this.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

from workers.node.disk.budget import DiskBudget
from workers.node.disk.produced import writing_async
from workers.node.runtime.memfile import allocated_bytes
from workers.node.runtime.snapshot import Snapshot

__all__ = ["VM_EXTRA", "restore_need", "vm_writes"]

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


@asynccontextmanager
async def vm_writes(
    budget: DiskBudget | None, need: int, dirs: Iterable[Path]
) -> AsyncIterator[None]:
    """`need` bytes reserved (`NoRoom`: the start fails `unavailable`, placement goes
    elsewhere) and what appeared in `dirs` charged after; nothing without a budget."""
    if budget is None:
        yield
        return
    async with writing_async(budget, need, dirs):
        yield
