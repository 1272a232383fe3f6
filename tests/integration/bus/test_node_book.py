"""The API's view of node heartbeats against real JetStream: the followed mirror answers
"gone?" as the bucket would, and a node it has not heard of is read from the bucket."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator

import pytest_asyncio

from bus import Bus
from bus.nodes import Heartbeat, NodeBook


@pytest_asyncio.fixture
async def book(bus: Bus) -> AsyncIterator[NodeBook]:
    b = await NodeBook.open(bus.js, bus.names.nodes_bucket)
    try:
        yield b
    finally:
        await b.close()


async def _eventually(check: object, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.01)


async def test_the_mirror_follows_beats_and_deletions(bus: Bus, book: NodeBook) -> None:
    node = f"n-{secrets.token_hex(3)}"
    writer = await NodeBook.open(bus.js, bus.names.nodes_bucket)
    await writer.beat(Heartbeat(node_id=node, at=time.time(), every_s=1.0))
    book.follow()
    await _eventually(lambda: node in book.beats)
    assert not await book.gone(node)
    # a beat from long ago (the node stopped): gone, from the mirror alone
    await writer.beat(Heartbeat(node_id=node, at=time.time() - 60, every_s=1.0))
    await _eventually(lambda: book.beats[node].at < time.time() - 30)
    assert await book.gone(node)
    await writer.kv.delete(node)
    await _eventually(lambda: node not in book.beats)
    assert await book.gone(node)


async def test_a_node_not_mirrored_yet_is_read_from_the_bucket(bus: Bus, book: NodeBook) -> None:
    node = f"n-{secrets.token_hex(3)}"
    assert await book.gone(node)  # never beat
    await book.beat(Heartbeat(node_id=node, at=time.time(), every_s=5.0))
    assert not await book.gone(node)  # not following: straight from the bucket
