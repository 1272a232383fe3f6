"""The API role's Prometheus series (`docs/observability.md`): requests by route and
status, sandboxes by state and node, how far each projection is behind the log, and what
the nodes' heartbeats say (how old each is, captures waiting for upload).

Series read from shared state (the read model, the nodes bucket, the streams) are the
same on every API: dashboards and alert rules take `max` over them, never a sum
(`tests/deploy/test_grafana.py` keeps the dashboard to that).

Every label value comes from a closed set, so the number of series stays bounded whatever
clients send: `route` is the matched route's template (`/sandboxes/{sandbox_id}`), never
the raw path — an id per sandbox, or a scanner's random paths, would each start a new
series; paths that match no route share `unmatched`, proxied sandbox traffic shares
`sandbox-proxy`; methods outside HTTP's own set are `OTHER`. Values are still escaped by
the exposition (`prometheus-client`), so nothing in a label can end a line or a label.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import get_args

from prometheus_client import Counter, Gauge, Histogram

from bus.nodes import Heartbeat
from domain.lease import Lease, OnExpiry
from domain.sandbox import SandboxStatus
from shared.metrics import Scrape

__all__ = [
    "BUCKETS",
    "LIVE_STATES",
    "ON_EXPIRY",
    "REFUSALS",
    "SANDBOX_PROXY",
    "UNMATCHED",
    "Metrics",
    "method_label",
    "route_label",
]

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

#: `route` of a request that matched no control-plane route (404, 405, bad host)
UNMATCHED = "unmatched"
#: `route` of a request relayed to a sandbox (envd or a guest port)
SANDBOX_PROXY = "sandbox-proxy"
METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"}
)
#: The states `aenv_sandboxes` reports: every state a sandbox lives in (killed and failed
#: ones are history: counted, they would only grow)
LIVE_STATES = tuple(
    s.value for s in SandboxStatus if s not in (SandboxStatus.KILLED, SandboxStatus.FAILED)
)

#: Why admission control refused a request (`api/admission.py`)
REFUSALS = ("running", "rate", "no_room")

#: What a lease's expiry does to its sandboxes (`domain.lease.OnExpiry`)
ON_EXPIRY: tuple[str, ...] = get_args(OnExpiry)

#: (state, node, count) rows of the read model
Census = Callable[[], Awaitable[Iterable[tuple[str, str, int]]]]
#: projection → events it has not applied yet (None: not known now)
Lags = Callable[[], Awaitable[Mapping[str, int | None]]]


def route_label(template: str | None, proxied: bool) -> str:
    """The bounded `route` value of one request (`template`: the matched route's, if any)."""
    if proxied:
        return SANDBOX_PROXY
    return template or UNMATCHED


def method_label(method: str) -> str:
    return method if method in METHODS else "OTHER"


class Metrics:
    """The API's series in its process's registry (`scrape`)."""

    def __init__(self, scrape: Scrape | None = None) -> None:
        self.scrape = scrape or Scrape()
        r = self.scrape.registry
        self.requests = Counter(
            "aenv_api_requests",
            "API requests by route and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "aenv_api_request_seconds",
            "API request latency.",
            ["route"],
            buckets=BUCKETS,
            registry=r,
        )
        self.sandboxes = Gauge(
            "aenv_sandboxes",
            "Sandboxes by state and node (read model).",
            ["state", "node"],
            registry=r,
        )
        self.projection_lag = Gauge(
            "aenv_projection_lag_events",
            "Events of its kind in the log that a projection has not applied yet.",
            ["projection"],
            registry=r,
        )
        self.beat_age = Gauge(
            "aenv_node_heartbeat_age_seconds",
            "Seconds since each node's last heartbeat (the nodes bucket).",
            ["node"],
            registry=r,
        )
        self.uploads_waiting = Gauge(
            "aenv_node_uploads_waiting",
            "Captures a node failed to upload and retries (its heartbeat).",
            ["node"],
            registry=r,
        )
        self.upload_wait = Gauge(
            "aenv_node_oldest_upload_wait_seconds",
            "How long the oldest capture waiting for upload on a node has waited.",
            ["node"],
            registry=r,
        )

        self.refusals = Counter(
            "aenv_admission_refusals",
            "Creates, resumes and forks refused at once: a team past its running limit "
            "(running) or its creation rate (rate), both 429; a fleet with no room (no_room, "
            "503).",
            ["reason"],
            registry=r,
        )
        for reason in REFUSALS:  # every reason scraped from the start, at 0
            self.refusals.labels(reason=reason)
        self.lease_expiries = Counter(
            "aenv_lease_expiries",
            "Leases this API's lease timer expired (not renewed within their TTL), by what "
            "the expiry does to their sandboxes (kill or pause).",
            ["on_expiry"],
            registry=r,
        )
        for action in ON_EXPIRY:
            self.lease_expiries.labels(on_expiry=action)

    def lease_expired(self, lease: Lease) -> None:
        """Count one lease this API's timer expired (`workers.timer.leases`)."""
        self.lease_expiries.labels(on_expiry=lease.on_expiry).inc()

    def refused(self, reason: str) -> None:
        """Count one admission refusal (`REFUSALS`)."""
        self.refusals.labels(reason=reason).inc()

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method_label(method), route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def count_sandboxes(self, census: Census, beating: Callable[[], Iterable[str]] = tuple) -> None:
        """Read `aenv_sandboxes` from the read model at each scrape; `beating`: the nodes
        that beat now (an idle node's states read 0 rather than nothing)."""

        async def refresh() -> None:
            rows = list(await census())
            nodes = {node for _, node, _ in rows} | set(beating())
            self.sandboxes.clear()  # a node without sandboxes any more: its series go
            for node in nodes:  # every state of a node that has any: 0 is an answer too
                for state in LIVE_STATES:
                    self.sandboxes.labels(state, node).set(0)
            for state, node, n in rows:
                self.sandboxes.labels(state, node).set(n)

        self.scrape.on_scrape("sandboxes", refresh)

    def measure_projections(self, lags: Lags) -> None:
        """Read `aenv_projection_lag_events` from the projectors at each scrape."""

        async def refresh() -> None:
            for name, lag in (await lags()).items():
                if lag is not None:
                    self.projection_lag.labels(name).set(lag)

        self.scrape.on_scrape("projections", refresh)

    def watch_heartbeats(self, beats: Callable[[], Iterable[Heartbeat]]) -> None:
        """Read the nodes' heartbeats at each scrape: their age (a node gone reads a
        growing age until its entry leaves the bucket, then nothing: the rules also
        watch Prometheus's `up` of the node) and their upload backlog."""

        async def refresh() -> None:
            now = time.time()
            for gauge in (self.beat_age, self.uploads_waiting, self.upload_wait):
                gauge.clear()
            for b in beats():
                self.beat_age.labels(b.node_id).set(max(0.0, now - b.at))
                self.uploads_waiting.labels(b.node_id).set(b.uploads_waiting)
                self.upload_wait.labels(b.node_id).set(b.oldest_upload_wait_s)

        self.scrape.on_scrape("heartbeats", refresh)

    async def render(self) -> bytes:
        return await self.scrape.render()
