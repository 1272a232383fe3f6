"""The template builder's Prometheus series: builds waiting for a builder, builds running
here, and how long builds took by result (`docs/observability.md`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from prometheus_client import Gauge, Histogram

from shared.metrics import Scrape

__all__ = ["BuildMetrics"]

#: A build runs from seconds (a FROM with no steps) to most of an hour (apt, compilers).
BUCKETS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
RESULTS = ("ready", "error")


class BuildMetrics:
    def __init__(self, scrape: Scrape | None = None) -> None:
        self.scrape = scrape or Scrape()
        r = self.scrape.registry
        self.queue = Gauge(
            "aenv_template_build_queue",
            "Template builds started and not taken by a builder yet.",
            registry=r,
        )
        self.running = Gauge(
            "aenv_template_builds_running", "Template builds this builder runs now.", registry=r
        )
        self.duration = Histogram(
            "aenv_template_build_seconds",
            "Template build duration, from claim to verdict, by result.",
            ["result"],
            buckets=BUCKETS,
            registry=r,
        )
        for result in RESULTS:
            self.duration.labels(result)

    def count_queue(self, waiting: Callable[[], Awaitable[int]]) -> None:
        """Read the queue (the builders' shared consumer's undelivered starts) at each
        scrape."""

        async def refresh() -> None:
            self.queue.set(await waiting())

        self.scrape.on_scrape("builds", refresh)

    def built(self, seconds: float, ok: bool) -> None:
        self.duration.labels(RESULTS[0] if ok else RESULTS[1]).observe(seconds)
