"""Operational routes: health (open, for load balancers: liveness and readiness) and
Prometheus metrics (an API key or the metrics token, see `api.scrape`)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get
from litestar.openapi import ResponseSpec

from api import health as checks
from api.auth import HEADER
from api.context import ApiContext
from api.errors import documented, error_body
from api.scrape import authorize_scrape
from shared.metrics import CONTENT_TYPE

_NOT_READY = ResponseSpec(
    data_container=dict[str, Any],
    generate_examples=False,
    description="Not ready: `{code, message, checks, warnings}`, the message naming what "
    "is down (NATS, Postgres, S3, no node beating)",
)
_READINESS = {**documented(500), 503: _NOT_READY}


async def _ready(ctx: ApiContext) -> Response[dict[str, Any]]:
    results = await checks.run(checks.probes(ctx))
    status, message = checks.verdict(results)
    more = {
        "checks": {name: why or "ok" for name, why in results.items()},
        "warnings": checks.warnings(ctx),
    }
    if status == 200:  # the body `/health` always had on success, with the checks' states
        return Response({"status": "ok", "nats": True, **more}, status_code=200)
    return Response({**error_body(status, message), **more}, status_code=status)


@get("/health", media_type="application/json", responses=_READINESS)
async def health(ctx: ApiContext) -> Response[dict[str, Any]]:
    """Readiness, under the path E2B's API has (the SDK does not call it; load balancers
    and `aenv status` do)."""
    return await _ready(ctx)


@get("/health/ready", media_type="application/json", responses=_READINESS)
async def ready(ctx: ApiContext) -> Response[dict[str, Any]]:
    """200 once NATS, Postgres, S3 (if any) answer and a node beats; else 503 naming what
    is down."""
    return await _ready(ctx)


@get("/health/live", media_type="application/json", responses=documented(500))
async def live() -> dict[str, str]:
    """The process answers: restart it only when this fails, not when a dependency is down
    (restarting the API would not bring Postgres back)."""
    return {"status": "ok"}


@get("/metrics", media_type=CONTENT_TYPE, responses=documented(500))
async def metrics(ctx: ApiContext, request: Request[Any, Any, Any]) -> Response[bytes]:
    """The API role's Prometheus series (`docs/observability.md`): an API key or
    `Authorization: Bearer $AENV_METRICS_TOKEN`."""
    await authorize_scrape(ctx, request.headers.get(HEADER), request.headers.get("authorization"))
    return Response(await ctx.metrics.render(), media_type=CONTENT_TYPE)


ROUTES = [health, ready, live, metrics]
