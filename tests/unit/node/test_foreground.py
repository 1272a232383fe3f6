"""Housekeeping waits for the restores a client waits on, and runs at the lowest priority."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from workers.node.foreground import Foreground, in_background
from workers.node.runtime.memfile import CHUNK, clone_or_sparse_copy


async def _settle_time(fg: Foreground) -> float:
    t0 = time.monotonic()
    await fg.settled()
    return time.monotonic() - t0


async def test_an_idle_node_goes_at_once() -> None:
    assert await _settle_time(Foreground(quiet_s=0.2)) < 0.05


async def test_housekeeping_waits_for_the_restore_and_a_quiet_moment_after_it() -> None:
    fg = Foreground(quiet_s=0.15, max_wait_s=5.0)

    async def restore() -> None:
        with fg.busy():
            await asyncio.sleep(0.3)

    task = asyncio.create_task(restore())
    await asyncio.sleep(0.01)
    waited = await _settle_time(fg)
    await task
    assert 0.3 + 0.15 - 0.05 <= waited < 0.3 + 0.15 + 0.2


async def test_a_node_that_never_goes_quiet_still_gets_its_housekeeping_done() -> None:
    fg = Foreground(quiet_s=0.1, max_wait_s=0.3)
    with fg.busy():
        waited = await _settle_time(fg)
    assert 0.25 <= waited < 0.5


async def test_closing_releases_the_waiters() -> None:
    fg = Foreground(quiet_s=10, max_wait_s=10)
    with fg.busy():
        waiter = asyncio.create_task(fg.settled())
        await asyncio.sleep(0.05)
        fg.closing()
        await asyncio.wait_for(waiter, 1.0)


async def test_background_threads_run_at_nice_19_and_give_it_back() -> None:
    if os.geteuid() != 0:
        pytest.skip("raising the priority back needs root")

    def nice() -> tuple[int, int]:
        return threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    tid, during = await in_background(nice)
    assert during == 19
    assert os.getpriority(os.PRIO_PROCESS, tid) == 0  # the pool thread is normal again


async def test_a_background_copy_stops_at_its_next_chunk_while_a_restore_runs(
    tmp_path: Path,
) -> None:
    src, dst = tmp_path / "mem", tmp_path / "copy"
    with open(src, "wb") as f:  # three chunks of data with a hole between two of them
        f.write(os.urandom(CHUNK))
        f.seek(4 * CHUNK)
        f.write(os.urandom(2 * CHUNK))
    fg = Foreground(quiet_s=0.0, max_wait_s=5.0)
    copied: list[float] = []

    def pause_point() -> None:
        fg.pause_point()
        copied.append(time.monotonic())

    with fg.busy():
        copy = asyncio.create_task(in_background(clone_or_sparse_copy, src, dst, pause_point))
        await asyncio.sleep(0.3)
        assert len(copied) == 0  # the first chunk is done, but the copy waits
        t_end = time.monotonic()
    assert await copy == "sparse"
    assert len(copied) == 3 and copied[0] >= t_end
    assert dst.read_bytes() == src.read_bytes()
