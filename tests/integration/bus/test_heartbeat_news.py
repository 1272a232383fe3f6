"""A node's heartbeat says news (a disk walk ended: its room changed) at once, against real
JetStream: with a period of a minute, the API would otherwise place creates by a room a
minute old, and a create right after a kill made room met 503 (the catalogue test saw it)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time

from bus import Bus
from bus.nodes import NodeBook
from tests.support import eventually
from workers.node.capacity import Ledger
from workers.node.heartbeat import beat_forever
from workers.node.memory import MemoryHost


async def test_news_beats_at_once_not_at_the_next_period(bus: Bus) -> None:
    node = f"n-{secrets.token_hex(3)}"
    room = [1 << 30]
    news = asyncio.Event()
    ledger = Ledger(vcpus=2, mem_mib=2048, max_sandboxes=4)
    beats = asyncio.create_task(
        beat_forever(
            bus,
            MemoryHost(capacity=4),
            node,
            60.0,
            ledger.room,
            disk_room=lambda: room[0],
            news=news,
        )
    )
    book = await NodeBook.open(bus.js, bus.names.nodes_bucket)
    try:
        book.follow()

        async def said(n: int) -> bool:
            beat = book.beats.get(node)
            return beat is not None and beat.disk_room == n

        await eventually(lambda: said(1 << 30), timeout=10)
        room[0] = 3 << 30  # a kill made room: the next walk found it
        await asyncio.sleep(0.5)
        assert await said(1 << 30)  # no news, no beat: the period is a minute
        t0 = time.monotonic()
        news.set()
        await eventually(lambda: said(3 << 30), timeout=10)
        assert time.monotonic() - t0 < 5, "the news waited for the period"
    finally:
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beats
        await book.close()
