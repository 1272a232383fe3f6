"""A trace's prefetch over the block service's real chunk cache and a real (POSIX) store
in a temporary directory, whose fetches take a moment and are logged: in the trace's
order, at most `concurrency` fetches in flight counting the ones reads wait for, a chunk
both prefetched and read fetched once, and a stop before it would evict recent chunks."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

from workers.snapshot import PosixStore
from workers.snapshot.blocks.chunkcache import ChunkCache
from workers.snapshot.blocks.prefetch import prefetch
from workers.snapshot.blocks.trace import PlannedChunk

CHUNK = 64 << 10


class SlowStore(PosixStore):
    """The POSIX store, each blob GET taking `delay` seconds; starts and ends logged."""

    def __init__(self, root: Path, delay: float = 0.05):
        super().__init__(root)
        self.delay = delay
        self.log: list[tuple[str, str]] = []
        self.inflight = 0
        self.most = 0

    async def get_blob_to(self, digest: str, dest: Path) -> int:
        self.log.append(("start", digest))
        self.inflight += 1
        self.most = max(self.most, self.inflight)
        try:
            await asyncio.sleep(self.delay)
            return await super().get_blob_to(digest, dest)
        finally:
            self.inflight -= 1
            self.log.append(("end", digest))


async def chunks(store: PosixStore, n: int) -> list[PlannedChunk]:
    out = []
    for i in range(n):
        data = os.urandom(CHUNK)
        digest = hashlib.sha256(data).hexdigest()
        await store.put_blob(digest, data)
        out.append(PlannedChunk(i, digest, CHUNK))
    return out


def starts(store: SlowStore) -> list[str]:
    return [d for what, d in store.log if what == "start"]


async def test_a_plan_is_fetched_in_order_within_its_concurrency_and_is_no_miss(
    tmp_path: Path,
) -> None:
    store = SlowStore(tmp_path / "store")
    plan = await chunks(store, 8)
    cache = ChunkCache(tmp_path / "cache", store, 100 * CHUNK)
    landed: list[int] = []
    got = await prefetch(cache, plan, concurrency=3, protect_s=10, on_fetched=landed.append)
    assert (got.chunks, got.bytes, got.stopped) == (8, 8 * CHUNK, False)
    assert landed == [CHUNK] * 8
    assert starts(store) == [c.digest for c in plan]
    assert store.most == 3
    assert cache.counters.misses == 0 and cache.cached_chunks == 8
    again = await prefetch(cache, plan, concurrency=3, protect_s=10)  # all here: no fetch
    assert again.chunks == 0 and len(starts(store)) == 8


async def test_reads_take_the_slots_first_and_join_what_is_on_its_way(tmp_path: Path) -> None:
    store = SlowStore(tmp_path / "store", delay=0.2)
    *plan, x, y = await chunks(store, 6)
    cache = ChunkCache(tmp_path / "cache", store, 100 * CHUNK)

    async def read(digest: str) -> Path:
        with cache.hold([digest]):
            return await cache.get(digest)

    demand = [asyncio.create_task(read(d.digest)) for d in (x, y)]
    await asyncio.sleep(0)  # both reads' fetches start
    ahead = asyncio.create_task(prefetch(cache, plan, concurrency=2, protect_s=10))
    await asyncio.sleep(0.05)
    assert starts(store) == [x.digest, y.digest]  # the two slots are the reads'
    await asyncio.gather(*demand)
    await asyncio.sleep(0.05)
    joined = await read(plan[1].digest)  # on its way: the read waits for that fetch
    got = await ahead
    assert got.chunks == 4 and joined == cache.path_for(plan[1].digest)
    assert starts(store) == [x.digest, y.digest, *(c.digest for c in plan)]  # each once
    assert cache.counters.misses == 2 and cache.counters.bytes_fetched == 6 * CHUNK


async def test_a_prefetch_stops_before_evicting_what_was_used_just_now(tmp_path: Path) -> None:
    store = SlowStore(tmp_path / "store", delay=0)
    plan = await chunks(store, 5)
    cache = ChunkCache(tmp_path / "cache", store, 3 * CHUNK)
    got = await prefetch(cache, plan, concurrency=2, protect_s=60)
    assert got.stopped and got.chunks == 3 and cache.counters.evictions == 0
    assert starts(store) == [c.digest for c in plan[:3]]
    # nothing recent to spare (protect 0): it goes on, least recently used out first
    rest = await prefetch(cache, plan[3:], concurrency=1, protect_s=0)
    assert not rest.stopped and rest.chunks == 2 and cache.counters.evictions == 2
    assert cache.cached_bytes == 3 * CHUNK
