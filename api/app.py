"""The API's composition: Litestar app for the control plane, wrapped by the sandbox proxy.

`create_app(ctx, resolve)` is the one place that wires routes, dependencies, error
handlers and OpenAPI; the process that runs it (aenv serve) owns the resources in `ctx`.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from litestar import Litestar, Request
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from opentelemetry import trace
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

from api import (
    bulk,
    leases,
    network,
    nodes,
    observed,
    sandboxes,
    snapfork,
    snapshots,
    system,
    tags,
    templates,
    volume_content,
    volumes,
)
from api.auth import HEADER, Caller
from api.console.routes import ROUTES as CONSOLE
from api.context import ApiContext
from api.errors import HANDLERS
from api.ids import short_path
from api.inputs import MAX_BODY, check_request
from api.metrics import method_label, route_label
from bus import logcontext
from shared.proxy import (
    ASGIApp,
    Receive,
    Resolver,
    SandboxProxy,
    SandboxUnavailable,
    Scope,
    Send,
    Upstream,
    sandbox_target,
)

log = logging.getLogger(__name__)


async def _ctx(request: Request[Any, Any, Any]) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


async def _caller(request: Request[Any, Any, Any], ctx: ApiContext) -> Caller:
    return await ctx.keys.caller(request.headers.get(HEADER))


async def _no_route(sandbox_id: str, port: int, token: str | None) -> Upstream:
    raise SandboxUnavailable(sandbox_id)


def create_litestar(ctx: ApiContext, resolve: Resolver = _no_route) -> Litestar:
    """The control plane; `resolve` finds a sandbox's guest (the console's terminal talks
    to its envd the way the proxy does)."""
    app = Litestar(
        route_handlers=[
            *observed.ROUTES,
            *sandboxes.ROUTES,
            *network.ROUTES,
            *snapshots.ROUTES,
            *snapfork.ROUTES,
            *templates.ROUTES,
            *tags.ROUTES,
            *system.ROUTES,
            *CONSOLE,
            *volumes.ROUTES,
            *volume_content.ROUTES,
            *nodes.ROUTES,
            *leases.ROUTES,
            *bulk.ROUTES,
        ],
        dependencies={"ctx": Provide(_ctx), "caller": Provide(_caller)},
        exception_handlers=HANDLERS,
        before_request=check_request,
        request_max_body_size=MAX_BODY,  # the upload route takes more (`templates.MAX_UPLOAD`)
        openapi_config=OpenAPIConfig(title="aenv", version="0.1.0", path="/openapi"),
        debug=False,
        # no logging set-up of its own: it replaced the process's root handler with a
        # plain-text one (`aenv.logs` writes every record as JSON)
        logging_config=None,
    )
    app.state.ctx = ctx
    app.state.resolve = resolve
    return app


class _Routed:
    """Names the request's SERVER span by the route it matched, once Litestar matched it:
    the template (`POST /sandboxes/{sandbox_id}/pause`), never the path — one span name per
    route, whatever the ids in it (the span starts named by the method alone)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        span = trace.get_current_span()

        async def named(message: dict[str, Any]) -> None:
            # before the answer goes: the middleware ends the span with the response
            if message["type"] == "http.response.start" and (
                template := scope.get("path_template")
            ):
                span.update_name(f"{scope['method']} {template}")
                span.set_attribute("http.route", template)
            await send(message)

        await self.app(scope, receive, named if scope["type"] == "http" else send)


def _span_name(scope: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return method_label(scope.get("method", "")), {}


def _traced(app: ASGIApp) -> ASGIApp:
    """The control plane under OpenTelemetry's ASGI middleware (a SERVER span per request,
    its parent from the caller's `traceparent`), when a tracer provider is installed."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return app
    traced = OpenTelemetryMiddleware(
        _Routed(app), default_span_details=_span_name, exclude_spans=["receive", "send"]
    )
    return traced  # type: ignore[return-value]  # ASGI-compatible (MutableMapping scope)


#: A control-plane path about one sandbox (`/sandboxes/{id}…`, `/v2/sandboxes/{id}…`)
_SANDBOX_PATH = re.compile(r"^/(?:v\d+/)?sandboxes/([a-z0-9]{1,63})(?:/|$)")


def _sandbox_of(scope: Scope) -> str | None:
    """The sandbox a control-plane request is about, for its log lines (None: none)."""
    m = _SANDBOX_PATH.match(scope.get("path", ""))
    return m.group(1) if m and m.group(1) != "metrics" else None


class MeasuredApp:
    """Counts and times every response for /metrics, proxied sandbox traffic included: the
    outermost layer, in front of the sandbox proxy."""

    def __init__(self, proxy: SandboxProxy, ctx: ApiContext) -> None:
        self.app: ASGIApp = proxy
        self.proxy, self.ctx = proxy, ctx

    def close_sandbox(self, sandbox_id: str, keep_via: str | None = None) -> None:
        """End the proxied streams of a sandbox that is gone or moved (`SandboxProxy`)."""
        if cut := self.proxy.close_sandbox(sandbox_id, keep_via):
            why = "gone" if keep_via is None else f"routed to {keep_via}"
            log.info("cut %d proxied stream(s) of sandbox %s: %s", cut, sandbox_id, why)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        status = 500
        target = sandbox_target(scope, self.ctx.settings.sandbox_domain)
        proxied = target is not None
        if not proxied and (path := short_path(scope["path"])) != scope["path"]:
            # e2b 1.3.3's `{sandboxID}-{clientID}`: routed (and logged) by the sandbox id
            scope = {**scope, "path": path, "raw_path": path.encode()}

        async def send_wrapper(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            with logcontext.bound(sandbox_id=target[0] if target else _sandbox_of(scope)):
                await self.app(scope, receive, send_wrapper)
        finally:
            # Litestar leaves the matched route's template in the scope it was handed
            route = route_label(scope.get("path_template"), proxied)
            self.ctx.metrics.observe(scope["method"], route, status, time.monotonic() - start)


def create_app(ctx: ApiContext, resolve: Resolver) -> MeasuredApp:
    """The ASGI app to serve: sandbox traffic to guests, the rest to the control plane."""
    inner: ASGIApp = create_litestar(ctx, resolve)  # type: ignore[assignment]  # ASGI-compatible
    proxy = SandboxProxy(_traced(inner), resolve, domain=ctx.settings.sandbox_domain)
    return MeasuredApp(proxy, ctx)
