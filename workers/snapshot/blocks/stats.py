"""The block service's counters, written as `<cache dir>/stats.json` about once a second.

A file, not a metrics endpoint: the node supervises this process and turns the file into
its own metrics (cache hits, misses, bytes fetched, fetch latency), and a test or an
operator reads it with `cat`. Written to a private name and renamed, so a reader never
sees half a document.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workers.snapshot.blocks.chunkcache import ChunkCache

__all__ = ["FILE", "BlockStats", "ExportStats", "write_stats", "write_stats_every"]

log = logging.getLogger(__name__)

FILE = "stats.json"


@dataclass
class ExportStats:
    """One export (an image's disk) since the service started."""

    size: int
    bytes_fetched: int = 0
    reads: int = 0
    bytes_read: int = 0


class BlockStats:
    """Everything `stats.json` says: the cache's counters, reads, and each export's."""

    def __init__(self, cache: ChunkCache):
        self.cache = cache
        self.reads = 0
        self.bytes_read = 0
        self.read_errors = 0
        self.connections = 0
        self.exports: dict[str, ExportStats] = {}
        # a trace's prefetch (`workingset`): chunks and bytes fetched ahead of reads, and
        # traces stored (recorded here) and found (replayed here)
        self.prefetched_chunks = 0
        self.prefetched_bytes = 0
        self.trace_recorded = 0
        self.trace_loaded = 0

    def export(self, digest: str, size: int) -> ExportStats:
        return self.exports.setdefault(digest, ExportStats(size))

    def read(self, export: ExportStats, nbytes: int) -> None:
        self.reads += 1
        self.bytes_read += nbytes
        export.reads += 1
        export.bytes_read += nbytes

    def prefetched(self, export: ExportStats, nbytes: int) -> None:
        self.prefetched_chunks += 1
        self.prefetched_bytes += nbytes
        export.bytes_fetched += nbytes

    def snapshot(self) -> dict[str, Any]:
        c = self.cache.counters
        return {
            "hits": c.hits,
            "misses": c.misses,
            "bytes_fetched": c.bytes_fetched,
            "fetch_seconds_total": round(c.fetch_seconds_total, 6),
            "fetch_errors": c.fetch_errors,
            "prefetches": c.prefetches,
            "cached_bytes": self.cache.cached_bytes,
            "cached_chunks": self.cache.cached_chunks,
            "cache_cap_bytes": self.cache.cap_bytes,
            "evictions": c.evictions,
            "reads": self.reads,
            "bytes_read": self.bytes_read,
            "read_errors": self.read_errors,
            "connections": self.connections,
            "prefetched_chunks": self.prefetched_chunks,
            "prefetched_bytes": self.prefetched_bytes,
            "trace_recorded": self.trace_recorded,
            "trace_loaded": self.trace_loaded,
            "exports": {d: asdict(e) for d, e in self.exports.items()},
        }


def write_stats(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True) + "\n")
    os.replace(tmp, path)


async def write_stats_every(stats: BlockStats, directory: Path, every_s: float = 1.0) -> None:
    """Rewrite `directory/stats.json` whenever it changed, checking every `every_s`; once
    more when cancelled (a stop leaves the final counts)."""
    path = directory / FILE
    last: dict[str, Any] | None = None
    try:
        while True:
            doc = stats.snapshot()
            if doc != last:
                try:
                    write_stats(path, doc)
                    last = doc
                except OSError as e:  # a full disk must not end the service
                    log.warning("blocks: cannot write %s: %s", path, e)
            await asyncio.sleep(every_s)
    finally:
        with contextlib.suppress(OSError):
            write_stats(path, stats.snapshot())
