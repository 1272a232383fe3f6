"""The RAM pool on real files (no VMs): many sources come and go, as template builds and
their deletions do, and the pool's directory stays within its budget throughout and ends
empty once every source is gone."""

from __future__ import annotations

import shutil
from pathlib import Path

from workers.node.foreground import Foreground
from workers.node.runtime.memfile import allocated_bytes
from workers.node.runtime.rampool import RamPool

MIB = 1 << 20


def _capture(root: Path, name: str, data_mib: int = 2) -> Path:
    """A capture directory with a 16 MiB sparse 'RAM file' holding `data_mib` of data."""
    d = root / "snapshots" / name
    d.mkdir(parents=True)
    mem = d / "mem"
    with open(mem, "wb") as f:
        f.truncate(16 * MIB)
        f.write(b"x" * data_mib * MIB)
    return mem


def _on_disk(pool: RamPool) -> tuple[int, int]:
    files = list(pool.root.glob("*.mem"))
    return len(files), sum(allocated_bytes(f) for f in files)


def _pool(tmp_path: Path, budget: int) -> RamPool:
    fg = Foreground(quiet_s=0.0)
    return RamPool(
        tmp_path / "ram-pool", settled=fg.settled, pause_point=fg.pause_point, budget_bytes=budget
    )


async def test_many_sources_and_their_deletion_stay_within_the_budget(tmp_path: Path) -> None:
    budget = 5 * MIB  # two sources' worth of copies (one of 2 MiB each) and change
    pool = _pool(tmp_path, budget)
    mems = []
    try:
        for i in range(20):  # 20 templates built, each restored once
            mem = _capture(tmp_path, f"tpl-{i}")
            mems.append(mem)
            assert pool.take(mem) is None  # nothing ready for a new source: the create copies
            await pool.idle()
            files, held = _on_disk(pool)
            assert held <= budget, f"after source {i}: {held} bytes on disk"
            assert pool.stats().bytes == held and pool.stats().files == files
        # the most recent sources keep their copy: a create of the last one takes it
        assert pool.stats().files == 2
        ready = pool.take(mems[-1])
        assert ready is not None and ready.exists()
        ready.unlink()
        await pool.idle()
        for mem in mems:  # every template deleted
            pool.forget_under(mem.parent)
            shutil.rmtree(mem.parent)
        assert _on_disk(pool) == (0, 0)
        assert pool.stats().files == 0 and pool.stats().sources == 0
    finally:
        await pool.close()


async def test_a_forgotten_source_is_not_refilled(tmp_path: Path) -> None:
    pool = _pool(tmp_path, 64 * MIB)
    mem = _capture(tmp_path, "tpl-a")
    try:
        pool.take(mem)
        pool.forget(mem)  # deleted before its refill ran
        await pool.idle()
        assert _on_disk(pool) == (0, 0)
        pool.take(mem)
        await pool.idle()
        assert _on_disk(pool)[0] == 1  # one ready copy per source asked once
        pool.forget(mem)
        assert _on_disk(pool) == (0, 0)
    finally:
        await pool.close()


async def test_copies_of_a_source_deleted_behind_its_back_go_on_the_next_fill(
    tmp_path: Path,
) -> None:
    """A capture removed without `forget` (a path that missed it) does not pin its copies."""
    pool = _pool(tmp_path, 64 * MIB)
    a, b = _capture(tmp_path, "tpl-a"), _capture(tmp_path, "tpl-b")
    try:
        pool.take(a)
        await pool.idle()
        shutil.rmtree(a.parent)
        pool.take(b)
        await pool.idle()
        assert pool.stats().sources == 1 and pool.stats().files == 1
        assert _on_disk(pool)[0] == 1
    finally:
        await pool.close()


async def test_a_source_that_ran_dry_keeps_two_copies(tmp_path: Path) -> None:
    """One ready copy while each create finds one, or finds none because the budget dropped
    it; a create that found none while its refill was under way (creates faster than the
    refill) makes it keep two."""
    pool = _pool(tmp_path, 64 * MIB)
    mem = _capture(tmp_path, "tpl-a")
    try:
        assert pool.take(mem) is None  # the first create: nothing made yet
        await pool.idle()
        assert _on_disk(pool)[0] == 1
        taken = pool.take(mem)
        assert taken is not None
        taken.unlink()
        await pool.idle()
        assert _on_disk(pool)[0] == 1  # found one: still one
        [ready] = pool.ready_files()
        assert pool.drop(ready)  # the disk budget evicts it
        assert pool.take(mem) is None
        await pool.idle()
        assert _on_disk(pool)[0] == 1  # dropped, not outrun: still one
        for _ in range(2):  # two creates at once: the second finds none
            if (got := pool.take(mem)) is not None:
                got.unlink()
        await pool.idle()
        assert _on_disk(pool)[0] == 2
    finally:
        await pool.close()


async def test_a_zero_budget_keeps_no_copies(tmp_path: Path) -> None:
    pool = _pool(tmp_path, 0)
    mem = _capture(tmp_path, "tpl-a")
    try:
        pool.take(mem)
        await pool.idle()
        assert _on_disk(pool) == (0, 0)
    finally:
        await pool.close()
