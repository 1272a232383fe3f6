"""Prometheus metrics of one aenv process (`prometheus-client`): the registry its series
live in, what is read fresh at each scrape, who may scrape, and the JetStream consumer
series both roles report.

Each process has its own registry (not the library's global one), so a test or a
simulator running several services in one process keeps their series apart. Counters and
histograms are updated where things happen; gauges of things another system knows (how
many sandboxes the read model holds per state, how far a JetStream consumer is behind)
are read when Prometheus asks: `Scrape.render` runs every registered refresh first, each
bounded in time, a failed one logged and counted (`aenv_scrape_errors_total{source}`)
while the rest of the answer still comes.

Every label takes values from a closed or fleet-bounded set (states, stages, route
templates, consumer names, node ids): never a sandbox id or a raw path, whatever clients
send. The text format's escaping (backslash, double quote, line feed) is the library's.

Who may scrape (`docs/observability.md`): `Authorization: Bearer $AENV_METRICS_TOKEN` on
every role's `/metrics` (the API also takes an API key). There is no unauthenticated
variant: the series name every route, node and template, and the ports they are served on
also carry sandbox traffic.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator

from nats.js import JetStreamContext
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from bus.supervised import restarts

__all__ = ["CONTENT_TYPE", "ConsumerGauges", "Scrape", "bearer", "is_token"]

log = logging.getLogger(__name__)

# No `<counter>_created` twin of every counter and histogram series: twice the series, and
# Prometheus reads a counter's restart from its drop anyway.
disable_created_metrics()  # type: ignore[no-untyped-call]

#: What `/metrics` answers with (the text exposition format 0.0.4)
CONTENT_TYPE = CONTENT_TYPE_LATEST

Refresh = Callable[[], Awaitable[None]]

#: A refresh that takes longer is abandoned for this scrape (Prometheus's own scrape
#: timeout is 10 s by default: the answer must come well before)
REFRESH_TIMEOUT_S = 2.0


class Scrape:
    """A process's registry and what to read before each exposition."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._refresh: list[tuple[str, Refresh]] = []
        self._errors = Counter(
            "aenv_scrape_errors",
            "Refreshes of scraped gauges that failed, by source.",
            ["source"],
            registry=self.registry,
        )
        self.registry.register(_TaskRestarts())

    def on_scrape(self, source: str, refresh: Refresh) -> None:
        """Run `refresh` before each exposition (`source` names it in errors)."""
        self._errors.labels(source).inc(0)
        self._refresh.append((source, refresh))

    async def render(self) -> bytes:
        """The exposition, after every refresh had its chance."""

        async def one(source: str, refresh: Refresh) -> None:
            try:
                await asyncio.wait_for(refresh(), REFRESH_TIMEOUT_S)
            except Exception as e:
                self._errors.labels(source).inc()
                log.warning("metrics: refreshing %s failed: %s", source, e)

        await asyncio.gather(*(one(s, r) for s, r in self._refresh))
        return generate_latest(self.registry)


class _TaskRestarts(Collector):
    """`aenv_task_restarts_total{task}`: background tasks of this process that died and
    were restarted in place (`bus.supervised`), read at the scrape — 0 for each task
    supervised so far. Any increase is a bug to look at: the task's traceback is in the
    log at ERROR. (A task that keeps dying takes its role down instead: the supervisor's
    restart count shows that.)"""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "aenv_task_restarts",
            "Background tasks (heartbeat, consumers, timer) that died and were restarted.",
            labels=["task"],
        )
        for task, n in sorted(restarts().items()):
            family.add_metric([task], n)
        yield family


def bearer(authorization: str | None) -> str | None:
    """The credentials of an `Authorization: Bearer …` header, else None."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    return value if scheme.lower() == "bearer" and value else None


def is_token(given: str | None, configured: str | None) -> bool:
    """`given` is the configured metrics token (compared in constant time; no token
    configured: nothing is)."""
    if given is None or not configured:
        return False
    return hmac.compare_digest(given.encode(), configured.encode())


class ConsumerGauges:
    """How far durable JetStream consumers are behind, read at each scrape: messages not
    delivered yet (`pending`), delivered and not acknowledged (`ack_pending`), delivered
    more than once and still not acknowledged (`redelivered`: a handler that fails, or a
    worker that died holding them)."""

    def __init__(self, scrape: Scrape, js: JetStreamContext) -> None:
        self._js = js
        self._watched: list[tuple[str, Callable[[], Iterable[str]]]] = []
        r, labels = scrape.registry, ["stream", "consumer"]
        self.pending = Gauge(
            "aenv_jetstream_consumer_pending",
            "Messages a durable consumer has not delivered yet.",
            labels,
            registry=r,
        )
        self.ack_pending = Gauge(
            "aenv_jetstream_consumer_ack_pending",
            "Messages delivered and not acknowledged yet.",
            labels,
            registry=r,
        )
        self.redelivered = Gauge(
            "aenv_jetstream_consumer_redelivered",
            "Messages delivered more than once and not acknowledged.",
            labels,
            registry=r,
        )
        scrape.on_scrape("jetstream", self.refresh)

    def watch(self, stream: str, durables: Callable[[], Iterable[str]]) -> None:
        """Report `durables` of `stream` (asked at each scrape: a node's consumers exist
        once its worker started)."""
        self._watched.append((stream, durables))

    async def refresh(self) -> None:
        for stream, durables in self._watched:
            for durable in durables():
                info = await self._js.consumer_info(stream, durable)
                self.pending.labels(stream, durable).set(info.num_pending or 0)
                self.ack_pending.labels(stream, durable).set(info.num_ack_pending or 0)
                self.redelivered.labels(stream, durable).set(info.num_redelivered or 0)
