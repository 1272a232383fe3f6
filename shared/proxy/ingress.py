"""Who may reach a sandbox's guest ports: E2B's private ingress (`allowPublicTraffic=false`).

Such a sandbox's route carries the digest of its traffic access token (`bus.routes`), and a
request to any of its guest ports must present the token in `e2b-traffic-access-token`, as
E2B's proxy asks; it is compared in constant time, so answer times leak nothing of it.
envd's port is exempt: envd checks its own per-sandbox token (`X-Access-Token`), and the
SDK never sends the traffic token there. The refusal is E2B's 403, word for word.
"""

from __future__ import annotations

import hmac
from typing import Any

from bus.routes import traffic_digest

__all__ = ["ENVD_PORT", "TRAFFIC_TOKEN_HEADER", "presented_token", "refusal"]

TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"
#: envd's port in every guest (e2b-compat §1.2)
ENVD_PORT = 49983

_HEADER = TRAFFIC_TOKEN_HEADER.encode()


def presented_token(scope: dict[str, Any]) -> str | None:
    """The traffic token a request carries (its first such header), or None."""
    for k, v in scope.get("headers", ()):
        if k == _HEADER:
            return str(v.decode("latin-1"))
    return None


def refusal(digest: str | None, port: int, presented: str | None) -> str | None:
    """E2B's 403 message for a request that may not reach `port`, or None to let it through.

    `digest` is the route's (None: a public sandbox); `presented` the request's token."""
    if digest is None or port == ENVD_PORT:
        return None
    if not presented:  # E2B treats an empty header as a missing one
        return (
            "Sandbox is secured with traffic access token. "
            f"Token header '{TRAFFIC_TOKEN_HEADER}' is missing"
        )
    if not hmac.compare_digest(traffic_digest(presented), digest):
        return (
            "Sandbox is secured with traffic access token. "
            f"Provided token in header '{TRAFFIC_TOKEN_HEADER}' is invalid"
        )
    return None
