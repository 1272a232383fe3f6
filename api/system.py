"""Unauthenticated operational routes: health and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from litestar import Response, get

from api.context import ApiContext


@get("/health", media_type="application/json")
async def health(ctx: ApiContext) -> Response[dict[str, Any]]:
    ok = ctx.bus.nc.is_connected
    return Response({"status": "ok" if ok else "degraded", "nats": ok},
                    status_code=200 if ok else 503)  # fmt: skip


@get("/metrics", media_type="text/plain; version=0.0.4")
async def metrics(ctx: ApiContext) -> str:
    return ctx.metrics.render()


ROUTES = [health, metrics]
