"""The block service's chunk cache over a real (POSIX) store in a temporary directory:
one fetch per chunk however many reads want it, LRU by bytes under the cap, pinned chunks
kept, the counters the node turns into metrics, and a restart that finds its files."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from workers.snapshot import CorruptBlob, PosixStore
from workers.snapshot.blocks.chunkcache import ChunkCache
from workers.snapshot.blocks.export import Export
from workers.snapshot.blocks.stats import BlockStats
from workers.snapshot.manifest import MemoryRef

CHUNK = 64 << 10


async def put(store: PosixStore, n: int) -> list[str]:
    out = []
    for _ in range(n):
        data = os.urandom(CHUNK)
        digest = hashlib.sha256(data).hexdigest()
        await store.put_blob(digest, data)
        out.append(digest)
    return out


async def test_concurrent_reads_of_a_missing_chunk_fetch_it_once(tmp_path: Path) -> None:
    store = PosixStore(tmp_path / "store")
    [d] = await put(store, 1)
    cache = ChunkCache(tmp_path / "cache", store, 10 * CHUNK)
    fetched: list[int] = []
    with cache.hold([d]):
        paths = await asyncio.gather(*(cache.get(d, fetched.append) for _ in range(8)))
    assert len(set(paths)) == 1 and hashlib.sha256(paths[0].read_bytes()).hexdigest() == d
    assert fetched == [CHUNK]  # only the read that fetched it is told
    c = cache.counters
    assert (c.misses, c.hits, c.bytes_fetched) == (1, 7, CHUNK)
    assert (cache.cached_bytes, cache.cached_chunks) == (CHUNK, 1)
    assert paths[0] == tmp_path / "cache" / "chunks" / d[:2] / d


async def test_least_recently_used_go_first_pinned_ones_stay(tmp_path: Path) -> None:
    store = PosixStore(tmp_path / "store")
    a, b, c, d = await put(store, 4)
    cache = ChunkCache(tmp_path / "cache", store, 2 * CHUNK)
    for x in (a, b):
        with cache.hold([x]):
            await cache.get(x)
    with cache.hold([a]):
        await cache.get(a)  # a is now the most recent: b goes first
    with cache.hold([c]):
        await cache.get(c)
    assert not cache.path_for(b).exists() and cache.path_for(a).exists()
    assert cache.counters.evictions == 1
    with cache.hold([a, c]):  # both pinned: d's arrival exceeds the cap rather than evict
        with cache.hold([d]):
            await cache.get(d)
            assert cache.cached_bytes == 3 * CHUNK
            assert all(cache.path_for(x).exists() for x in (a, c, d))
        # d released: the only unpinned chunk, it goes at once (not at the next fetch)
        assert cache.cached_bytes == 2 * CHUNK and not cache.path_for(d).exists()
    with cache.hold([b]):
        await cache.get(b)
    assert cache.cached_bytes == 2 * CHUNK
    assert cache.counters.misses == 5


async def test_a_restart_finds_its_chunks_and_drops_partial_fetches(tmp_path: Path) -> None:
    store = PosixStore(tmp_path / "store")
    digests = await put(store, 3)
    cache = ChunkCache(tmp_path / "cache", store, 10 * CHUNK)
    for x in digests:
        with cache.hold([x]):
            await cache.get(x)
    (tmp_path / "cache" / "chunks" / ".tmp" / "cut").write_bytes(b"half")
    again = ChunkCache(tmp_path / "cache", store, 2 * CHUNK)  # a smaller cap: trims at start
    assert again.cached_chunks == 2 and again.counters.evictions == 1
    assert list((tmp_path / "cache" / "chunks" / ".tmp").iterdir()) == []
    with again.hold([digests[2]]):
        await again.get(digests[2])
    assert again.counters.misses == 0


async def test_a_corrupt_chunk_is_never_placed(tmp_path: Path) -> None:
    store = PosixStore(tmp_path / "store")
    [d] = await put(store, 1)
    [blob] = [p for p in (tmp_path / "store").rglob(d)]
    blob.write_bytes(os.urandom(CHUNK))  # the store's copy rotted
    cache = ChunkCache(tmp_path / "cache", store, 10 * CHUNK)
    with cache.hold([d]), pytest.raises(CorruptBlob):
        await cache.get(d)
    assert not cache.path_for(d).exists() and cache.cached_chunks == 0
    assert cache.counters.fetch_errors == 1


async def test_a_reader_that_goes_away_does_not_cancel_the_fetch_others_wait_on(
    tmp_path: Path,
) -> None:
    store = PosixStore(tmp_path / "store")
    [d] = await put(store, 1)
    cache = ChunkCache(tmp_path / "cache", store, 10 * CHUNK)
    fetched: list[int] = []
    with cache.hold([d]):
        first = asyncio.create_task(cache.get(d, fetched.append))
        await asyncio.sleep(0)  # its fetch is under way (in the store's thread)
        second = asyncio.create_task(cache.get(d))
        await asyncio.sleep(0)
        first.cancel()  # the client that asked first disconnected
        path = await second
    assert first.cancelled()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == d
    assert fetched == [CHUNK]  # still counted to the export that started it
    assert (cache.counters.misses, cache.counters.hits, cache.counters.fetch_errors) == (1, 1, 0)


async def test_readahead_follows_a_sequential_reader_and_not_a_random_one(
    tmp_path: Path,
) -> None:
    store = PosixStore(tmp_path / "store")
    digests = await put(store, 8)
    chunks: tuple[str | None, ...] = (*digests[:4], None, *digests[4:])
    disk = MemoryRef(size=9 * CHUNK, chunk_size=CHUNK, chunks=chunks)
    cache = ChunkCache(tmp_path / "cache", store, 100 * CHUNK)
    stats = BlockStats(cache)
    export = Export("x" * 64, disk, cache, stats.export("x" * 64, disk.size), readahead=2)
    await export.read(0, CHUNK)  # a first read: no direction yet
    assert cache.counters.prefetches == 0
    await export.read(CHUNK, 100)  # into the next chunk: chunks 2 and 3 start
    assert cache.counters.prefetches == 2
    got = await export.read(2 * CHUNK, 3 * CHUNK)  # on to the zero chunk 4: 5 and 6 next
    assert got[2 * CHUNK :] == bytes(CHUNK)
    await asyncio.sleep(0.2)
    assert cache.counters.prefetches == 4 and cache.cached_chunks == 6
    await export.read(8 * CHUNK, 10)  # a jump: a miss, nothing ahead
    assert cache.counters.prefetches == 4 and cache.counters.misses == 7
    assert export.stats.bytes_fetched == 7 * CHUNK  # what readahead fetched counts too
