"""A fork's children: one capture of the running parent, then N copy-on-write restores.

All children load before any of them runs: on few cores, a guest already running (under
TCG, a busy vCPU thread) slows the launches of its later siblings. Per-child failures are
returned, not raised, so one bad child does not cost the others. What it needs of the
runtime is a port (`Forkable`) so that this module and `runtime.py` do not import each
other.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from workers.node.net import EgressPolicy
from workers.node.runtime.snapshot import Snapshot
from workers.node.runtime.vm import Timing, Vm, init_vm_envd

__all__ = ["Forkable", "fork_children"]


class Forkable(Protocol):
    async def capture(
        self, vm: Vm, *, resume: bool, snapshot_id: str | None = None, detach: bool = False
    ) -> Snapshot: ...

    async def restore(
        self,
        snap: Snapshot,
        *,
        vm_id: str | None = None,
        private_memory: bool = True,
        policy: EgressPolicy | None = None,
        run: bool = True,
        counted: bool = True,
    ) -> tuple[Vm, Timing]: ...

    async def destroy(self, vm: Vm, *, background: bool = False) -> None: ...


async def fork_children(
    rt: Forkable,
    vm: Vm,
    count: int,
    *,
    wait: bool,
    vm_ids: list[str] | None,
    policy: EgressPolicy | None,
) -> tuple[Snapshot, list[Vm | BaseException]]:
    """The capture and the children, in order (a child that failed is its exception).
    The caller reserved the disk room for all of them before the capture (a fork that does
    not fit is refused whole, never half made): the children's restores do not."""
    ids: list[str | None] = list(vm_ids) if vm_ids else [None] * count
    snap = await rt.capture(vm, resume=True)
    results = await asyncio.gather(
        *(
            rt.restore(snap, vm_id=i, private_memory=True, run=False, policy=policy, counted=False)
            for i in ids
        ),
        return_exceptions=True,
    )
    children: list[Vm | BaseException] = [
        r if isinstance(r, BaseException) else r[0] for r in results
    ]

    async def start(child: Vm) -> Vm:
        try:
            await child.qemu.cont()
            if wait:
                await init_vm_envd(child, None, None)
        except BaseException:
            await rt.destroy(child)
            raise
        return child

    started = await asyncio.gather(
        *(start(c) for c in children if isinstance(c, Vm)), return_exceptions=True
    )
    it = iter(started)
    return snap, [c if isinstance(c, BaseException) else next(it) for c in children]
