"""The snapshot repository's Prometheus series: bytes and time of every upload of a capture
to the store and download from it (`docs/observability.md`). `direction` is `upload` or
`download`; blobs a cache or the store already had move no bytes and are not counted."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from shared.metrics import Scrape

__all__ = ["DIRECTIONS", "TransferMetrics"]

DIRECTIONS = ("upload", "download")
#: A capture moves in tens of milliseconds (a small delta) to minutes (a first upload of
#: gigabytes of guest memory).
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class TransferMetrics:
    def __init__(self, scrape: Scrape | None = None) -> None:
        r = (scrape or Scrape()).registry
        self.bytes = Counter(
            "aenv_snapshot_transfer_bytes",
            "Bytes of captures sent to or fetched from the snapshot store.",
            ["direction"],
            registry=r,
        )
        self.seconds = Histogram(
            "aenv_snapshot_transfer_seconds",
            "Duration of each capture upload or download.",
            ["direction"],
            buckets=BUCKETS,
            registry=r,
        )
        self.failures = Counter(
            "aenv_snapshot_transfer_failures",
            "Capture uploads or downloads that failed.",
            ["direction"],
            registry=r,
        )
        for d in DIRECTIONS:
            self.bytes.labels(d)
            self.seconds.labels(d)
            self.failures.labels(d)

    def moved(self, direction: str, n_bytes: int, seconds: float) -> None:
        self.bytes.labels(direction).inc(n_bytes)
        self.seconds.labels(direction).observe(seconds)

    def failed(self, direction: str) -> None:
        self.failures.labels(direction).inc()
