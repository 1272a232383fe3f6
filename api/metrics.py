"""The API role's Prometheus series (`docs/observability.md`): requests by route and
status, sandboxes by state and node, how far each projection is behind the log.

Every label value comes from a closed set, so the number of series stays bounded whatever
clients send: `route` is the matched route's template (`/sandboxes/{sandbox_id}`), never
the raw path — an id per sandbox, or a scanner's random paths, would each start a new
series; paths that match no route share `unmatched`, proxied sandbox traffic shares
`sandbox-proxy`; methods outside HTTP's own set are `OTHER`. Values are still escaped by
the exposition (`prometheus-client`), so nothing in a label can end a line or a label.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping

from prometheus_client import Counter, Gauge, Histogram

from domain.sandbox import SandboxStatus
from shared.metrics import Scrape

__all__ = [
    "BUCKETS",
    "LIVE_STATES",
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

    async def render(self) -> bytes:
        return await self.scrape.render()
