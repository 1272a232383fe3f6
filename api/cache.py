"""A small cache for slowly changing lookups on the create path (templates, where a
snapshot lives): a create should not wait on two database round trips for what changes
once a day, not even the one create in five that finds its entry expired."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

Load = Callable[[], Awaitable[Any]]


class LookupCache:
    """Entries younger than `ttl` are served as they are; older ones, up to `stale`, are
    served while one background refresh runs; past `stale` a lookup loads inline. This
    process's own changes `forget` their keys, so it never serves itself stale."""

    def __init__(self, ttl: float = 5.0, stale: float = 30.0) -> None:
        self.ttl = ttl
        self.stale = stale
        self._entries: dict[str, tuple[float, Any]] = {}
        self._refreshing: dict[str, asyncio.Task[None]] = {}

    async def get(self, key: str, load: Load) -> Any:
        hit = self._entries.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        if hit is not None and now - hit[0] < self.stale:
            if key not in self._refreshing:
                task = asyncio.create_task(self._refresh(key, load), name=f"refresh:{key}")
                self._refreshing[key] = task
                task.add_done_callback(lambda _: self._refreshing.pop(key, None))
            return hit[1]
        value = await load()
        self._entries[key] = (now, value)
        return value

    async def _refresh(self, key: str, load: Load) -> None:
        started = time.monotonic()
        try:
            value = await load()
        except Exception:  # the first lookup past `stale` loads inline and raises it
            return
        hit = self._entries.get(key)
        if hit is not None and hit[0] < started:  # not forgotten or replaced meanwhile
            self._entries[key] = (started, value)

    def forget(self, prefix: str) -> None:
        for k in [k for k in self._entries if k.startswith(prefix)]:
            del self._entries[k]
