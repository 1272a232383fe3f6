"""A Prometheus text endpoint for the API: request counts and latency by route and status.

Small on purpose: a counter and a fixed-bucket histogram are all the API needs, and the
exposition format is a few lines of text.

Every label value comes from a closed set, so the number of series stays bounded whatever
clients send: `route` is the matched route's template (`/sandboxes/{sandbox_id}`), never
the raw path — an id per sandbox, or a scanner's random paths, would each start a new
series; paths that match no route share `unmatched`, proxied sandbox traffic shares
`sandbox-proxy`; methods outside HTTP's own set are `OTHER`. Values are still escaped
as the exposition format says, so nothing in a label can end a line or a label early.
"""

from __future__ import annotations

from collections import defaultdict

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

#: `route` of a request that matched no control-plane route (404, 405, bad host)
UNMATCHED = "unmatched"
#: `route` of a request relayed to a sandbox (envd or a guest port)
SANDBOX_PROXY = "sandbox-proxy"
METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"}
)


def route_label(template: str | None, proxied: bool) -> str:
    """The bounded `route` value of one request (`template`: the matched route's, if any)."""
    if proxied:
        return SANDBOX_PROXY
    return template or UNMATCHED


def method_label(method: str) -> str:
    return method if method in METHODS else "OTHER"


def escape_label(value: str) -> str:
    """A label value as the text exposition format writes it: backslash, double quote and
    line feed escaped (the three characters that could otherwise end the value or line)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self.latency: dict[str, list[int]] = defaultdict(lambda: [0] * (len(BUCKETS) + 1))
        self.latency_sum: dict[str, float] = defaultdict(float)
        self.gauges: dict[str, float] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests[(method_label(method), route, status)] += 1
        counts = self.latency[route]
        for i, b in enumerate(BUCKETS):
            if seconds <= b:
                counts[i] += 1
        counts[-1] += 1
        self.latency_sum[route] += seconds

    def render(self) -> str:
        lines = [
            "# HELP aenv_api_requests_total API requests by route and status.",
            "# TYPE aenv_api_requests_total counter",
        ]
        for (m, r, s), n in sorted(self.requests.items()):
            m, r = escape_label(m), escape_label(r)
            lines.append(f'aenv_api_requests_total{{method="{m}",route="{r}",status="{s}"}} {n}')
        lines += [
            "# HELP aenv_api_request_seconds API request latency.",
            "# TYPE aenv_api_request_seconds histogram",
        ]
        for route, counts in sorted(self.latency.items()):
            r = escape_label(route)
            for b, n in zip(BUCKETS, counts, strict=False):
                lines.append(f'aenv_api_request_seconds_bucket{{route="{r}",le="{b}"}} {n}')
            lines.append(f'aenv_api_request_seconds_bucket{{route="{r}",le="+Inf"}} {counts[-1]}')
            total = self.latency_sum[route]
            lines.append(f'aenv_api_request_seconds_sum{{route="{r}"}} {total:.6f}')
            lines.append(f'aenv_api_request_seconds_count{{route="{r}"}} {counts[-1]}')
        for name, value in sorted(self.gauges.items()):
            lines += [f"# TYPE {name} gauge", f"{name} {value}"]
        return "\n".join(lines) + "\n"
