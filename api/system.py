"""Operational routes: health (open, for load balancers) and Prometheus metrics (an API key
or the metrics token, see `api.scrape`)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get
from litestar.openapi import ResponseSpec

from api.auth import HEADER
from api.context import ApiContext
from api.errors import documented
from api.scrape import authorize_scrape

_DEGRADED = ResponseSpec(data_container=dict[str, Any], description="NATS is not connected",
                         generate_examples=False)  # fmt: skip


@get("/health", media_type="application/json", responses={**documented(500), 503: _DEGRADED})
async def health(ctx: ApiContext) -> Response[dict[str, Any]]:
    ok = ctx.bus.nc.is_connected
    return Response({"status": "ok" if ok else "degraded", "nats": ok},
                    status_code=200 if ok else 503)  # fmt: skip


@get("/metrics", media_type="text/plain; version=0.0.4", responses=documented(500))
async def metrics(ctx: ApiContext, request: Request[Any, Any, Any]) -> str:
    await authorize_scrape(ctx, request.headers.get(HEADER),
                           request.headers.get("authorization"))  # fmt: skip
    return ctx.metrics.render()


ROUTES = [health, metrics]
