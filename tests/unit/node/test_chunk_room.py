"""The block service's chunk cache inside the node's disk budget (issue 29): its cap held
as room for the service's life and counted once (the walk's `blob_cache` + what it may
still add), lowered to what the budget can hold, never below the floor."""

from __future__ import annotations

import os
from pathlib import Path

from shared.blockcap import read_cap
from workers.node.disk import DiskUsage
from workers.node.disk.budget import DiskBudget
from workers.node.disk.chunkroom import (
    MIN_CAP_BYTES,
    chunk_cache_cap,
    hold_chunk_cache,
    refit_chunk_cache,
)

MiB = 1 << 20


def _file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))


def _budget(tmp_path: Path, budget: int) -> DiskBudget:
    state, images = tmp_path / "state", tmp_path / "images"
    state.mkdir(exist_ok=True)
    images.mkdir(exist_ok=True)
    return DiskBudget(DiskUsage(state, images), budget, headroom=0)


def test_the_cap_is_the_setting_or_what_the_budget_can_hold() -> None:
    assert chunk_cache_cap(4096 * MiB, held=0, free=10_000 * MiB) == 4096 * MiB
    # half the free room: the rest stays for VMs, images and captures
    assert chunk_cache_cap(4096 * MiB, held=100 * MiB, free=900 * MiB) == 550 * MiB
    assert chunk_cache_cap(500 * MiB, held=100 * MiB, free=900 * MiB) == 500 * MiB
    assert chunk_cache_cap(4096 * MiB, held=0, free=0) == MIN_CAP_BYTES  # the floor
    assert chunk_cache_cap(32 * MiB, held=0, free=0) == 32 * MiB  # never above the setting


def test_the_cache_s_cap_is_held_once_whatever_it_holds(tmp_path: Path) -> None:
    budget = _budget(tmp_path, 1024 * MiB)
    blocks = tmp_path / "state" / "blocks"
    _file(blocks / "chunks" / "a", 8 * MiB)  # a restarted node's warm cache
    _file(tmp_path / "state" / "vms" / "x" / "top.qcow2", 4 * MiB)
    before = budget.accounted()
    assert hold_chunk_cache(budget, blocks, 100 * MiB) == 100 * MiB
    # the walk counted the 8 MiB already; the hold adds only what the cap leaves
    held = budget.accounted() - before
    assert 92 * MiB - 64 * 1024 <= held <= 92 * MiB
    budget.walk()  # a walk counts the cache (blob_cache) and the hold shrinks by as much
    assert budget.usage.last is not None
    assert budget.usage.last.bytes["blob_cache"] >= 8 * MiB
    assert abs(budget.accounted() - (before + held)) <= 64 * 1024
    _file(blocks / "chunks" / "b", 8 * MiB)  # the service fetched more
    budget.walk()
    assert abs(budget.accounted() - (before + held)) <= 64 * 1024  # still the cap, once
    budget.stops_growing(blocks)
    assert budget.accounted() < before + 20 * MiB


def test_a_cap_the_budget_cannot_hold_is_lowered(tmp_path: Path) -> None:
    budget = _budget(tmp_path, 200 * MiB)
    _file(tmp_path / "images" / "images" / ("ab" * 32) / "root.ext4", 40 * MiB)
    blocks = tmp_path / "state" / "blocks"
    free = budget.free()
    assert 155 * MiB <= free <= 160 * MiB  # 200 less the image's 40 (and a few dirs)
    cap = hold_chunk_cache(budget, blocks, 4096 * MiB)
    assert abs(cap - free // 2) <= 64 * 1024  # (its directory, made now: 4 KiB)
    # the cache holds its half, the rest stays free: nothing is promised twice
    assert abs(budget.free() - (free - cap)) <= 64 * 1024


def test_a_cache_outside_the_budget_s_roots_is_not_its(tmp_path: Path) -> None:
    budget = _budget(tmp_path, 10 * MiB)
    elsewhere = tmp_path / "other-disk" / "blocks"
    assert hold_chunk_cache(budget, elsewhere, 4096 * MiB) == 4096 * MiB
    assert budget.reserved() == 0


def test_the_cap_follows_the_budget_s_room_and_the_service_is_told(tmp_path: Path) -> None:
    budget = _budget(tmp_path, 200 * MiB)
    image = tmp_path / "images" / "images" / ("ab" * 32) / "root.ext4"
    _file(image, 40 * MiB)
    blocks = tmp_path / "state" / "blocks"
    cap = hold_chunk_cache(budget, blocks, 4096 * MiB)
    assert 76 * MiB <= cap <= 80 * MiB and read_cap(blocks) == cap  # half of ~156 free
    # nothing changed: the fit holds (its own reserved room is not taken for someone else's)
    assert refit_chunk_cache(budget, blocks, 4096 * MiB, cap, step=MiB) == cap
    image.unlink()  # the image evicted: room again
    budget.walk()
    grown = refit_chunk_cache(budget, blocks, 4096 * MiB, cap, step=MiB)
    assert 96 * MiB <= grown <= 100 * MiB and read_cap(blocks) == grown
    assert abs(budget.free() - (budget.limit - budget.used() - grown)) <= 256 * 1024
    _file(image, 60 * MiB)  # another image landed: the cap comes down to half what is left
    budget.walk()
    shrunk = refit_chunk_cache(budget, blocks, 4096 * MiB, grown, step=MiB)
    assert 66 * MiB <= shrunk <= 70 * MiB and read_cap(blocks) == shrunk
    # a move smaller than the step is left alone
    assert refit_chunk_cache(budget, blocks, 4096 * MiB, shrunk + MiB // 2, step=MiB) == (
        shrunk + MiB // 2
    )
