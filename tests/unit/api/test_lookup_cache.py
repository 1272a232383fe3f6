"""The create path's lookup cache: fresh hits, stale-while-refreshing, inline past stale."""

from __future__ import annotations

import asyncio

import pytest

from api.cache import LookupCache


class Source:
    def __init__(self) -> None:
        self.value = 1
        self.loads = 0
        self.gate: asyncio.Event | None = None

    async def __call__(self) -> int:
        self.loads += 1
        if self.gate is not None:
            await self.gate.wait()
        return self.value


def _age(cache: LookupCache, key: str, seconds: float) -> None:
    at, value = cache._entries[key]
    cache._entries[key] = (at - seconds, value)


async def test_fresh_entries_are_served_without_loading() -> None:
    cache, src = LookupCache(ttl=5, stale=30), Source()
    assert await cache.get("k", src) == 1
    src.value = 2
    assert await cache.get("k", src) == 1
    assert src.loads == 1


async def test_a_stale_entry_is_served_while_one_refresh_runs() -> None:
    cache, src = LookupCache(ttl=5, stale=30), Source()
    await cache.get("k", src)
    _age(cache, "k", 10)
    src.value, src.gate = 2, asyncio.Event()
    assert await cache.get("k", src) == 1  # answered at once, not after the load
    assert await cache.get("k", src) == 1
    await asyncio.sleep(0)
    assert src.loads == 2  # one refresh, however many lookups
    src.gate.set()
    await asyncio.sleep(0.01)
    assert await cache.get("k", src) == 2
    assert src.loads == 2


async def test_past_stale_the_lookup_loads_inline() -> None:
    cache, src = LookupCache(ttl=5, stale=30), Source()
    await cache.get("k", src)
    _age(cache, "k", 31)
    src.value = 3
    assert await cache.get("k", src) == 3


async def test_a_refresh_does_not_resurrect_a_forgotten_key() -> None:
    cache, src = LookupCache(ttl=5, stale=30), Source()
    await cache.get("tpl:a", src)
    _age(cache, "tpl:a", 10)
    src.gate = asyncio.Event()
    await cache.get("tpl:a", src)
    cache.forget("tpl:")
    src.gate.set()
    await asyncio.sleep(0.01)
    assert "tpl:a" not in cache._entries


async def test_a_failed_refresh_keeps_the_entry_until_stale() -> None:
    cache = LookupCache(ttl=5, stale=30)

    async def broken() -> int:
        raise RuntimeError("db down")

    await cache.get("k", Source())
    _age(cache, "k", 10)
    assert await cache.get("k", broken) == 1
    await asyncio.sleep(0.01)
    _age(cache, "k", 25)
    with pytest.raises(RuntimeError):
        await cache.get("k", broken)
