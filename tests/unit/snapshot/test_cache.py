import hashlib
import os
import time
from pathlib import Path

from workers.snapshot.cache import BlobCache, CacheEntry, plan_eviction


def e(size: int, t: float) -> CacheEntry:
    return CacheEntry(size, t)


def test_nothing_goes_within_budget() -> None:
    assert plan_eviction({"a": e(5, 1), "b": e(5, 2)}, budget=10) == []


def test_least_recently_used_go_first_until_within_budget() -> None:
    entries = {"old": e(4, 1), "mid": e(4, 2), "new": e(4, 3)}
    assert plan_eviction(entries, budget=8) == ["old"]
    assert plan_eviction(entries, budget=4) == ["old", "mid"]
    assert plan_eviction(entries, budget=0) == ["old", "mid", "new"]


def test_protected_entries_stay_even_over_budget() -> None:
    entries = {"old": e(4, 1), "mid": e(4, 2), "new": e(4, 3)}
    assert plan_eviction(entries, budget=4, protected={"old"}) == ["mid", "new"]
    assert plan_eviction(entries, budget=0, protected={"old", "mid", "new"}) == []


async def _put(cache: BlobCache, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()

    async def load(path: Path) -> int:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return len(data)

    await cache.fetch(digest, load)
    return digest


async def test_cache_evicts_lru_and_survives_a_restart(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path, budget_bytes=3000)
    a = await _put(cache, os.urandom(1000))
    b = await _put(cache, os.urandom(1000))
    time.sleep(0.01)
    assert cache.get(a) is not None  # a is now more recent than b
    c = await _put(cache, os.urandom(1500))
    assert a in cache and c in cache and b not in cache
    assert cache.used_bytes <= 3000
    (cache.path_for(a).parent / ".half-written.part").write_bytes(b"x")

    again = BlobCache(tmp_path, budget_bytes=3000)  # the index is the directory itself
    assert a in again and c in again and again.used_bytes == 2500
    assert not list(tmp_path.rglob(".*.part"))  # leftovers of a crash are swept


async def test_held_blobs_are_not_evicted_until_released(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path, budget_bytes=1000)
    data = [os.urandom(800) for _ in range(2)]
    digests = [hashlib.sha256(d).hexdigest() for d in data]
    with cache.hold(digests):
        for d in data:
            await _put(cache, d)
        assert cache.used_bytes == 1600  # over budget while a download needs both
    assert cache.used_bytes <= 1000


async def test_a_hit_does_not_load(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path, budget_bytes=10_000)
    d = await _put(cache, b"x" * 10)

    async def boom(path: Path) -> int:
        raise AssertionError("loaded a cached blob")

    assert (await cache.fetch(d, boom)).read_bytes() == b"x" * 10


async def test_the_disk_budget_sets_its_size_and_drops_what_no_download_holds(
    tmp_path: Path,
) -> None:
    room = [10_000]
    cache = BlobCache(tmp_path, budget_bytes=lambda: room[0])  # asked at each trim
    a = await _put(cache, os.urandom(1000))
    b = await _put(cache, os.urandom(1000))
    room[0] = 1500  # the node's disk got tighter: the next fill trims to it
    c = await _put(cache, os.urandom(500))
    assert a not in cache and b in cache and c in cache
    with cache.hold([b]):
        assert not cache.drop(cache.path_for(b))  # a download needs it
    assert cache.drop(cache.path_for(b))
    assert b not in cache and not cache.path_for(b).exists() and cache.used_bytes == 500
