"""The block service's counters stay monotonic across its restarts (issue 29)."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry

from workers.node.blockmetrics import BlockMetrics


def _write(path: Path, **counts: int) -> None:
    path.write_text(json.dumps(counts))


def test_a_restarted_service_s_counts_add_to_the_old_ones(tmp_path: Path) -> None:
    stats = tmp_path / "stats.json"
    restarts = [0]
    metrics = BlockMetrics("n1", stats, lambda: restarts[0])
    registry = CollectorRegistry()
    registry.register(metrics)
    metrics.sample()  # no file yet: zeros, no error
    _write(stats, bytes_fetched=12 << 20, hits=5, cached_bytes=12 << 20)
    metrics.sample()
    _write(stats, bytes_fetched=4 << 20, hits=1, cached_bytes=16 << 20)  # a new process
    restarts[0] = 1

    def value(name: str) -> float | None:
        return registry.get_sample_value(name, {"node": "n1"})

    assert value("aenv_blocks_fetch_bytes_total") == 16 << 20
    assert value("aenv_blocks_hits_total") == 6
    assert value("aenv_blocks_cached_bytes") == 16 << 20
    assert value("aenv_blocks_restarts_total") == 1


def test_prefetch_and_trace_counts_are_series_monotonic_across_restarts(tmp_path: Path) -> None:
    """The keys `workers/snapshot/blocks/stats.py` writes for a boot trace's prefetch."""
    stats = tmp_path / "stats.json"
    metrics = BlockMetrics("n1", stats, lambda: 0)
    registry = CollectorRegistry()
    registry.register(metrics)
    _write(stats, prefetched_chunks=30, prefetched_bytes=30 << 20, trace_recorded=1)
    metrics.sample()
    _write(stats, prefetched_chunks=4, prefetched_bytes=4 << 20, trace_loaded=1)  # restarted

    def value(name: str) -> float | None:
        return registry.get_sample_value(name, {"node": "n1"})

    assert value("aenv_blocks_prefetched_chunks_total") == 34
    assert value("aenv_blocks_prefetched_bytes_total") == 34 << 20
    assert value("aenv_blocks_traces_recorded_total") == 1
    assert value("aenv_blocks_traces_loaded_total") == 1
