"""The RAM pool under the node's disk budget, on real files (no VM): a copy takes room
that is free (never evicts for one, and is not made without it), its ready copies are the
budget's `ram_pool` entries, dropped through the pool so its own count stays right, and a
copy being written is never among them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workers.node.disk import DiskUsage
from workers.node.disk.budget import DiskBudget, NoRoom
from workers.node.disk.evictor import CacheEvictor
from workers.node.foreground import Foreground
from workers.node.runtime.memfile import CHUNK, allocated_bytes
from workers.node.runtime.rampool import RamPool

MiB = 1 << 20


def _capture(state: Path, name: str, data: int) -> Path:
    """A capture's sparse 'RAM file': 64 MiB long, `data` bytes of it written."""
    mem = state / "snapshots" / name / "mem"
    mem.parent.mkdir(parents=True)
    with open(mem, "wb") as f:
        f.truncate(64 * MiB)
        f.write(os.urandom(data))
    return mem


def _pool(state: Path, budget: DiskBudget, pause_point: object = None) -> RamPool:
    fg = Foreground(quiet_s=0.0)
    pool = RamPool(
        state / "ram-pool",
        settled=fg.settled,
        pause_point=pause_point if callable(pause_point) else fg.pause_point,
    )
    pool.disk = budget
    return pool


def _node(tmp_path: Path, budget: int) -> tuple[Path, DiskBudget, CacheEvictor]:
    state = tmp_path / "state"
    state.mkdir()
    evictor = CacheEvictor(None, state)
    return state, DiskBudget(DiskUsage(state, None), budget, headroom=0, evictor=evictor), evictor


async def test_copies_are_charged_listed_and_dropped_through_the_pool(tmp_path: Path) -> None:
    state, budget, evictor = _node(tmp_path, 256 * MiB)
    mem = _capture(state, "tpl", 4 * MiB)
    budget.walk()
    walked = budget.used()
    pool = _pool(state, budget)
    evictor.ram_pool = pool
    try:
        assert pool.take(mem) is None
        assert pool.take(mem) is None  # asked again while the refill runs: it keeps two
        await pool.idle()
        files = sorted(pool.root.glob("*.mem"))
        assert len(files) == 2
        on_disk = sum(allocated_bytes(f) for f in files)
        assert budget.used() >= walked + on_disk  # charged as they were made: never low
        assert budget.reserved() == 0
        entries = [e for e in evictor.entries() if e.category == "ram_pool"]
        assert sorted(e.key for e in entries) == [str(f) for f in files]
        # the budget evicts one: through the pool, whose own count follows
        freed = evictor.remove(entries[0])
        assert freed == entries[0].bytes > 0
        assert not Path(entries[0].key).exists()
        assert pool.stats().files == 1
        # one a create took meanwhile frees nothing, and the create keeps its file
        taken = pool.take(mem)
        assert taken is not None and taken.exists()
        gone = next(e for e in entries if e.key == str(taken))
        assert evictor.remove(gone) == 0 and taken.exists()
        taken.unlink()
    finally:
        await pool.close()


async def test_no_copy_without_free_room_and_nothing_evicted_for_one(tmp_path: Path) -> None:
    state, budget, evictor = _node(tmp_path, 0)
    mem = _capture(state, "tpl", 4 * MiB)
    cached = state / "blob-cache" / "ab" / "blob"  # an evictable entry the copy must not take
    cached.parent.mkdir(parents=True)
    cached.write_bytes(os.urandom(MiB))
    budget.walk()
    budget.budget = budget.used() + MiB  # a MiB free: a 4 MiB copy does not fit
    pool = _pool(state, budget)
    evictor.ram_pool = pool
    try:
        pool.take(mem)
        await pool.idle()
        assert list(pool.root.glob("*.mem")) == []
        assert pool.stats().files == 0
        assert cached.exists(), "a cache's copy never evicts another cache"
        # the reservation itself: refused without evicting, though eviction could make it fit
        with pytest.raises(NoRoom):
            budget.reserve(2 * MiB, evict=False).__enter__()
        assert cached.exists()
    finally:
        await pool.close()


async def test_a_copy_being_made_is_never_an_entry(tmp_path: Path) -> None:
    state, budget, evictor = _node(tmp_path, 1 << 40)
    mem = _capture(state, "tpl", 3 * CHUNK)  # a sparse copy stops at each chunk
    seen: list[list[str]] = []
    on_disk: list[list[str]] = []

    def look() -> None:  # from the copying thread, mid-copy: as the budget's thread sees it
        seen.append([e.key for e in evictor.entries() if e.category == "ram_pool"])
        on_disk.append([str(p) for p in pool.root.glob("*.mem")])

    pool = _pool(state, budget, look)
    evictor.ram_pool = pool
    try:
        pool.take(mem)
        await pool.idle()
        if not seen:
            pytest.skip("the filesystem reflinked the copy: no copy in progress to look at")
        for listed, there in zip(seen, on_disk, strict=True):
            assert len(there) == len(listed) + 1  # the one being written is left out
        made = {str(p) for p in pool.root.glob("*.mem")}
        assert {e.key for e in evictor.entries()} == made
    finally:
        await pool.close()
