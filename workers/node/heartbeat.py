"""The node's heartbeat: its room and accelerator in the nodes bucket every few seconds.
Missing three marks it gone (`bus.nodes`): its paused sandboxes then resume elsewhere."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from bus import Bus
from bus.nodes import Heartbeat, NodeBook
from workers.node.ports import Host

__all__ = ["beat_forever"]

log = logging.getLogger(__name__)


async def beat_forever(
    bus: Bus, host: Host, node_id: str, every_s: float,
    uploads: Callable[[], tuple[int, float]] | None = None,
) -> None:  # fmt: skip
    """`uploads`: (captures waiting for a retried upload, oldest wait) from the snapshot
    worker, when the node has a repository."""
    book = await NodeBook.open(bus.js, bus.names.nodes_bucket)
    while True:
        accel = host.accelerator
        waiting, oldest = uploads() if uploads is not None else (0, 0.0)
        beat = Heartbeat(
            node_id=node_id, at=time.time(), every_s=every_s, capacity=host.capacity,
            free=host.free, running=host.running, accelerator=accel.accel,
            accelerator_reason=accel.reason, qemu=accel.vmm, uploads_waiting=waiting,
            oldest_upload_wait_s=oldest,
        )  # fmt: skip
        try:
            await book.beat(beat)
        except Exception as e:  # a missed heartbeat is retried on the next beat
            log.warning("node heartbeat failed: %s", e)
        await asyncio.sleep(every_s)
