"""The node's heartbeat: its room and accelerator in the nodes bucket every few seconds.
Missing three marks it gone (`bus.nodes`): its paused sandboxes then resume elsewhere, and
after `AENV_NODE_LOST_AFTER_S` the timer kills its running ones as lost — so the task runs
supervised (`bus.supervised`): restarted when it dies, or the role goes down."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from bus import Bus
from bus.failpoints import failpoint
from bus.nodes import Heartbeat, NodeBook
from workers.node.capacity import Room
from workers.node.ports import Host

__all__ = ["beat_forever"]

log = logging.getLogger(__name__)


async def beat_forever(
    bus: Bus,
    host: Host,
    node_id: str,
    every_s: float,
    room: Callable[[], Room],
    uploads: Callable[[], tuple[int, float]] | None = None,
    *,
    proxy: str | None = None,
    disk_used: Callable[[], int | None] | None = None,
    disk_budget: Callable[[], int | None] | None = None,
    disk_room: Callable[[], int | None] | None = None,
    disk_pinned: Callable[[], int | None] | None = None,
    cordoned: Callable[[], bool] | None = None,
    nudge: asyncio.Event | None = None,
) -> None:
    """`room`: the node's budget and what is left (`capacity.Ledger`); `uploads`:
    (captures waiting for a retried upload, oldest wait) from the snapshot worker, when
    the node has a repository; `disk_used`: bytes its data dirs allocate (`disk.DiskUsage`);
    `disk_budget`, `disk_room`, `disk_pinned`: its disk budget, free under it plus what it
    could evict, and what it cannot evict now (`disk.NodeDisk`); `cordoned`: whether an
    operator cordoned it (`cordon.CordonWatch`); `nudge`: set to beat at once (a cordon the
    API waits to see) instead of after the period."""
    book = await NodeBook.open(bus.js, bus.names.nodes_bucket)
    while True:
        failpoint("heartbeat.beat")  # a test's way to kill this task in a live node
        accel = host.accelerator
        waiting, oldest = uploads() if uploads is not None else (0, 0.0)
        r = room()
        pool = host.warm_stats()
        beat = Heartbeat(
            node_id=node_id,
            at=time.time(),
            every_s=every_s,
            capacity=r.sandboxes,
            free=r.free_sandboxes,
            running=host.running,
            paused=host.paused_count,
            vcpus=r.vcpus,
            mem_mib=r.mem_mib,
            free_vcpus=r.free_vcpus,
            free_mem_mib=r.free_mem_mib,
            proxy=proxy,
            accelerator=accel.accel,
            accelerator_reason=accel.reason,
            qemu=accel.vmm,
            uploads_waiting=waiting,
            oldest_upload_wait_s=oldest,
            warm=pool.ready,
            warm_hits=pool.hits,
            warm_misses=pool.misses,
            warm_mem_mib=pool.mem_mib,
            templates=host.held_templates(),
            disk_used=_call(disk_used),
            disk_budget=_call(disk_budget),
            disk_room=_call(disk_room),
            disk_pinned=_call(disk_pinned),
            cordoned=cordoned() if cordoned is not None else False,
        )
        try:
            await book.beat(beat)
        except Exception as e:  # a missed heartbeat is retried on the next beat
            log.warning("node heartbeat failed: %s", e)
        if nudge is None:
            await asyncio.sleep(every_s)
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(nudge.wait(), every_s)
        nudge.clear()


def _call(read: Callable[[], int | None] | None) -> int | None:
    return read() if read is not None else None
