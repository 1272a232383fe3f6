"""A Prometheus text endpoint for the API: request counts and latency by route and status.

Small on purpose: a counter and a fixed-bucket histogram are all the API needs, and the
exposition format is a few lines of text.
"""

from __future__ import annotations

from collections import defaultdict

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self.latency: dict[str, list[int]] = defaultdict(lambda: [0] * (len(BUCKETS) + 1))
        self.latency_sum: dict[str, float] = defaultdict(float)
        self.gauges: dict[str, float] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests[(method, route, status)] += 1
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
            lines.append(f'aenv_api_requests_total{{method="{m}",route="{r}",status="{s}"}} {n}')
        lines += [
            "# HELP aenv_api_request_seconds API request latency.",
            "# TYPE aenv_api_request_seconds histogram",
        ]
        for r, counts in sorted(self.latency.items()):
            for b, n in zip(BUCKETS, counts, strict=False):
                lines.append(f'aenv_api_request_seconds_bucket{{route="{r}",le="{b}"}} {n}')
            lines.append(f'aenv_api_request_seconds_bucket{{route="{r}",le="+Inf"}} {counts[-1]}')
            lines.append(f'aenv_api_request_seconds_sum{{route="{r}"}} {self.latency_sum[r]:.6f}')
            lines.append(f'aenv_api_request_seconds_count{{route="{r}"}} {counts[-1]}')
        for name, value in sorted(self.gauges.items()):
            lines += [f"# TYPE {name} gauge", f"{name} {value}"]
        return "\n".join(lines) + "\n"
