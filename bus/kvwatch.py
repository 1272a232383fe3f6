"""A KV bucket read as a stream: the values it holds, a marker, then every change.

The routes bucket (the proxy's mirror, a node's start-up sweep) and the nodes bucket (the
API's heartbeat mirror) are both followed this way; the watch protocol — a `None` entry
after the initial values, deletes and purges as operations, stopping the watcher — lives
here once.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import TypeVar

from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

__all__ = ["kv_entries"]

T = TypeVar("T")


async def kv_entries(
    kv: KeyValue, decode: Callable[[bytes], T | None]
) -> AsyncGenerator[tuple[str, T | None] | None, None]:
    """(key, value) for every key in the bucket now, then `None` once those are all in,
    then (key, value) for each change. A value of None: the key was deleted (or holds
    nothing `decode` accepts). Close it (`contextlib.aclosing`) to stop the watcher."""
    watcher = await kv.watchall()
    try:
        async for entry in watcher:
            if entry is None:
                yield None
                continue
            value = None if entry.operation in (KV_DEL, KV_PURGE) else entry.value
            yield entry.key, decode(value) if value else None
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()  # type: ignore[no-untyped-call]
