"""The repository GC's Prometheus series (`docs/observability.md`): what a round freed and
how rounds ended, and the manifests the janitor deleted by kind (`pause`, `template`,
`image`, `trace`)."""

from __future__ import annotations

from prometheus_client import Counter

from shared.metrics import Scrape
from workers.snapshot.results import GcReport

__all__ = ["MANIFEST_KINDS", "OUTCOMES", "GcMetrics"]

MANIFEST_KINDS = ("pause", "template", "image", "trace")
#: `ran`: this node held the lease and collected; `skipped`: another node holds it;
#: `failed`: the round raised (the next one retries).
OUTCOMES = ("ran", "skipped", "failed")


class GcMetrics:
    def __init__(self, scrape: Scrape | None = None) -> None:
        r = (scrape or Scrape()).registry
        self.deleted = Counter(
            "aenv_repository_gc_deleted",
            "Blobs the repository GC deleted (no manifest named them).",
            registry=r,
        )
        self.deleted_bytes = Counter(
            "aenv_repository_gc_deleted_bytes",
            "Bytes of the blobs the repository GC deleted.",
            registry=r,
        )
        self.rounds = Counter(
            "aenv_repository_gc_rounds",
            "Repository GC rounds on this node, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.manifests = Counter(
            "aenv_repository_manifests_deleted",
            "Manifests the janitor deleted because what they described is gone.",
            ["kind"],
            registry=r,
        )
        for o in OUTCOMES:
            self.rounds.labels(o)
        for k in MANIFEST_KINDS:
            self.manifests.labels(k)

    def collected(self, report: GcReport) -> None:
        self.deleted.inc(len(report.deleted))
        self.deleted_bytes.inc(report.bytes_freed)
        self.rounds.labels("ran").inc()

    def round(self, outcome: str) -> None:
        self.rounds.labels(outcome).inc()

    def manifest_deleted(self, kind: str) -> None:
        self.manifests.labels(kind).inc()
