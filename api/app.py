"""The API's composition: Litestar app for the control plane, wrapped by the sandbox proxy.

`create_app(ctx, resolve)` is the one place that wires routes, dependencies, error
handlers and OpenAPI; the process that runs it (aenv serve) owns the resources in `ctx`.
"""

from __future__ import annotations

import re
import time
from typing import Any

from litestar import Litestar, Request
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from api import sandboxes, snapshots, system, templates
from api.auth import HEADER, Caller
from api.context import ApiContext
from api.errors import HANDLERS
from api.inputs import MAX_BODY, check_request
from shared.proxy import ASGIApp, Receive, Resolver, SandboxProxy, Scope, Send

_ID = re.compile(r"/[a-z0-9]{12,63}(?=/|$)")


async def _ctx(request: Request[Any, Any, Any]) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


async def _caller(request: Request[Any, Any, Any], ctx: ApiContext) -> Caller:
    return await ctx.keys.caller(request.headers.get(HEADER))


def create_litestar(ctx: ApiContext) -> Litestar:
    app = Litestar(
        route_handlers=[*sandboxes.ROUTES, *snapshots.ROUTES, *templates.ROUTES, *system.ROUTES],
        dependencies={"ctx": Provide(_ctx), "caller": Provide(_caller)},
        exception_handlers=HANDLERS,
        before_request=check_request,
        request_max_body_size=MAX_BODY,  # the upload route takes more (`templates.MAX_UPLOAD`)
        openapi_config=OpenAPIConfig(title="aenv", version="0.1.0", path="/openapi"),
        debug=False,
    )
    app.state.ctx = ctx
    return app


class _Measured:
    """Counts and times every control-plane response for /metrics."""

    def __init__(self, app: ASGIApp, ctx: ApiContext) -> None:
        self.app, self.ctx = app, ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        status = 500

        async def send_wrapper(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        route = _ID.sub("/{id}", scope["path"])
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        with trace.get_tracer("aenv.api").start_as_current_span(
            f"{scope['method']} {route}",
            context=propagate.extract(headers),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": scope["method"], "http.route": route},
        ) as span:
            try:
                await self.app(scope, receive, send_wrapper)
            finally:
                span.set_attribute("http.response.status_code", status)
                self.ctx.metrics.observe(scope["method"], route, status, time.monotonic() - start)


def create_app(ctx: ApiContext, resolve: Resolver) -> SandboxProxy:
    """The ASGI app to serve: sandbox traffic to guests, the rest to the control plane."""
    inner: ASGIApp = create_litestar(ctx)  # type: ignore[assignment]  # ASGI-compatible
    return SandboxProxy(_Measured(inner, ctx), resolve, domain=ctx.settings.sandbox_domain)
