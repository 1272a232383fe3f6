"""The block service's counters as the node's series (issue 29): `aenv_blocks_*`, read at
the scrape from the `stats.json` the service rewrites about once a second.

The service keeps nothing across a restart (its counters start afresh), so the node keeps
them monotonic: it reads the file every second (`follow`), and a value below the last one
read means a new process, whose counts are added to what the old one had reached. A death
loses what the old process counted in its last second or so.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["BlockMetrics"]

#: counter name (without `aenv_blocks_`/`_total`) → (the stats key, help)
COUNTERS: dict[str, tuple[str, str]] = {
    "hits": ("hits", "Chunk reads the block service's cache served."),
    "misses": ("misses", "Chunk reads that fetched the chunk from the repository."),
    "fetch_bytes": ("bytes_fetched", "Bytes of chunks the block service fetched."),
    "fetch_seconds": ("fetch_seconds_total", "Time the block service's fetches took."),
    "read_bytes": ("bytes_read", "Bytes guests read through the block service."),
    "evictions": ("evictions", "Chunks the block service's cache evicted (LRU)."),
    # a template's boot working set fetched ahead (`workers/snapshot/blocks/workingset.py`)
    "prefetched_chunks": (
        "prefetched_chunks",
        "Chunks the block service fetched ahead of reads from a recorded boot trace.",
    ),
    "prefetched_bytes": (
        "prefetched_bytes",
        "Bytes of chunks the block service fetched ahead of reads from a boot trace.",
    ),
    "traces_recorded": (
        "trace_recorded",
        "Boot traces (a template's first reads) the block service recorded and stored.",
    ),
    "traces_loaded": (
        "trace_loaded",
        "Boot traces the block service found in the repository and prefetched from.",
    ),
}


class BlockMetrics(Collector):
    """`aenv_blocks_*{node}` from the service's stats file; `restarts` from its supervisor."""

    def __init__(self, node: str, stats: Path, restarts: Callable[[], int]) -> None:
        self.node = node
        self.stats = stats
        self.restarts = restarts
        self._last: dict[str, float] = {}
        self._base: dict[str, float] = {}
        self._totals: dict[str, float] = {}
        self._cached = 0.0

    def _read(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.stats.read_text())
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def _monotonic(self, key: str, value: float) -> float:
        if value < self._last.get(key, 0.0):  # a new process: its counts start at 0
            self._base[key] = self._base.get(key, 0.0) + self._last[key]
        self._last[key] = value
        return self._base.get(key, 0.0) + value

    def sample(self) -> None:
        """Read the stats file once (a few hundred bytes) into the running totals."""
        doc = self._read()
        for name, (key, _) in COUNTERS.items():
            self._totals[name] = self._monotonic(key, float(doc.get(key, 0) or 0))
        self._cached = float(doc.get("cached_bytes", 0) or 0)

    async def follow(self, every_s: float = 1.0) -> None:
        """Sample as often as the service writes, so a restart's reset is seen."""
        while True:
            self.sample()
            await asyncio.sleep(every_s)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        self.sample()
        for name, (_, text) in COUNTERS.items():
            family = CounterMetricFamily(f"aenv_blocks_{name}", text, labels=["node"])
            family.add_metric([self.node], self._totals[name])
            yield family
        cached = GaugeMetricFamily(
            "aenv_blocks_cached_bytes", "Bytes in the block service's chunk cache.", labels=["node"]
        )
        cached.add_metric([self.node], self._cached)
        yield cached
        restarts = CounterMetricFamily(
            "aenv_blocks_restarts",
            "Times the node restarted its block service after it died or hung.",
            labels=["node"],
        )
        restarts.add_metric([self.node], float(self.restarts()))
        yield restarts
