"""A trace's chunks fetched ahead of the reads that will want them, behind those reads.

Demand first: a read's miss starts its fetch at once (the cache's `get`), never queued
behind this; and this starts a fetch only while fewer than `concurrency` fetches are in
flight counting the ones reads wait for, so a busy guest's own misses take the slots. A
chunk both prefetched and read is fetched once: the read joins this fetch (the cache's
single flight). It stops for good before a fetch would evict a chunk used in the last
`protect_s` seconds: the cache is then too small for the trace, and what it holds was
wanted more recently than what the trace predicts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workers.snapshot.blocks.chunkcache import ChunkCache
from workers.snapshot.blocks.trace import PlannedChunk

__all__ = ["PrefetchResult", "prefetch"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrefetchResult:
    """What one prefetch did: chunks it fetched and their bytes; `stopped` when it gave up
    on the rest of its plan to spare the cache."""

    chunks: int
    bytes: int
    stopped: bool


async def prefetch(
    cache: ChunkCache,
    plan: list[PlannedChunk],
    *,
    concurrency: int,
    protect_s: float,
    on_fetched: Callable[[int], None] | None = None,
) -> PrefetchResult:
    """Fetch `plan`'s chunks in order (those not cached or on their way already).
    `on_fetched(bytes)`: told as each of its fetches lands. A fetch that fails is
    skipped (a read that needs the chunk fetches it and reports the error). Cancelled
    (the service stops), the fetches it started go on: they are the cache's tasks."""
    mine: set[asyncio.Task[Path]] = set()
    sizes: dict[asyncio.Task[Path], int] = {}
    done = [0, 0]
    stopped = False

    def landed(nbytes: int) -> None:
        done[0] += 1
        done[1] += nbytes
        if on_fetched is not None:
            on_fetched(nbytes)

    if concurrency < 1:
        return PrefetchResult(0, 0, False)
    for chunk in plan:
        while True:
            mine = {t for t in mine if not t.done()}
            demand = cache.demand_flights()
            if len(mine) + len(demand) < concurrency:
                break
            await asyncio.wait({*mine, *demand}, return_when=asyncio.FIRST_COMPLETED)
        if not cache.room_for(sum(sizes[t] for t in mine) + chunk.size, protect_s):
            stopped = True
            log.info("blocks: prefetch stops at chunk %d: the cache is full", chunk.index)
            break
        task = cache.fetch_ahead(chunk.digest, landed)
        if task is not None:
            mine.add(task)
            sizes[task] = chunk.size
    if mine:
        await asyncio.wait(mine)
    return PrefetchResult(done[0], done[1], stopped)
