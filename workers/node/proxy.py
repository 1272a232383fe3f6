"""The node's own sandbox proxy: `api proxy -> node -> guest` when the API runs elsewhere.

A guest's address (the netns end of its veth) is reachable only from its node's host, so
an API on another host sends sandbox traffic here, with `E2b-Sandbox-Id`/`-Port` saying
where it goes (`shared.proxy.RouteTable` with `via_node`); this proxy resolves them against
the VMs this node runs. It serves the same streaming proxy (HTTP and WebSocket) as the API.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from shared.metrics import CONTENT_TYPE, bearer, is_token
from shared.proxy import Receive, SandboxProxy, SandboxUnavailable, Scope, Send, Upstream
from workers.node.observe import GuestObserver
from workers.node.ports import Host
from workers.node.vmm import limits

App = Callable[[Scope, Receive, Send], Awaitable[None]]
#: The node's Prometheus exposition (`NodeMetrics.scrape.render`)
Exposition = Callable[[], Awaitable[bytes]]


def _answer(status: int, doc: object) -> App:
    return _send(status, json.dumps(doc).encode(), b"application/json")


def _send(status: int, body: bytes, content_type: bytes) -> App:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


#: A scrape without the token (the API's wording, less the API key a node cannot check)
_NO_TOKEN = {
    "code": 401,
    "message": "missing credentials: send Authorization: Bearer <AENV_METRICS_TOKEN>",
}


def _metrics(scope: Scope, exposition: Exposition, token: str | None) -> App | None:
    """`/metrics` with the metrics token; None when this is not a scrape."""
    if scope.get("path") != "/metrics" or scope["type"] != "http":
        return None
    header = dict(scope.get("headers", ())).get(b"authorization", b"").decode("latin-1")
    if not is_token(bearer(header), token):
        return _answer(401, _NO_TOKEN)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await _send(200, await exposition(), CONTENT_TYPE.encode())(scope, receive, send)

    return app


def _node_routes(
    ready: Callable[[], bool],
    observer: GuestObserver | None,
    status: Callable[[], dict[str, Any]],
    exposition: Exposition | None = None,
    token: str | None = None,
    volumes: App | None = None,
) -> App:
    """What this port answers besides sandbox traffic: the node's health, for a service
    manager's probes (Kubernetes, a load balancer): live once the process serves, ready
    once the node worker has reconciled and pulls commands (with its warm pool now: the
    heartbeat says it only every few seconds); its Prometheus series
    (`/metrics`, with `Authorization: Bearer $AENV_METRICS_TOKEN`: `metrics.py`); and,
    for the API, what the node observed of its guests (`observe.py`):
    `/sandboxes/{id}/metrics?start=&end=`, `/sandboxes/{id}/logs`,
    `/sandboxes/metrics?ids=a,b` (the latest of each); and the volume content operations
    the API relays (`/volumes/{id}/…`, `volumes/endpoint.py`)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if path.startswith("/volumes/") and scope["type"] == "http":
            if volumes is None:
                await _answer(
                    501,
                    {"code": 501, "message": "this node serves no volume content (it runs no VMs)"},
                )(scope, receive, send)
            else:
                await volumes(scope, receive, send)
        elif exposition is not None and (scrape := _metrics(scope, exposition, token)):
            await scrape(scope, receive, send)
        elif observer is not None and (found := _observed(observer, path, scope)) is not None:
            await _answer(200, found)(scope, receive, send)
        elif path == "/health/live":
            await _answer(200, {"status": "live"})(scope, receive, send)
        elif path in ("/health/ready", "/health"):
            if ready():
                await _answer(200, {"status": "ready", **status()})(scope, receive, send)
            else:
                await _answer(503, {"code": 503, "message": "node is starting"})(
                    scope, receive, send
                )
        else:
            await _answer(404, {"code": 404, "message": "node proxy: no E2b-Sandbox-Id"})(
                scope, receive, send
            )

    return app


def _status(host: Host) -> dict[str, Any]:
    """The ready answer's body: the warm pool's VMs by template and what an operator must
    know (VMs that run without caps, caps outside the node's own cgroup)."""
    return {"warm": host.warm_stats().ready, "warnings": limits.warnings(list(host.vm_guest_ram()))}


#: (routed, traffic digest) of a sandbox: what its route says (`RoutePublisher.ingress`)
Ingress = Callable[[str], tuple[bool, str | None]]


def _observed(observer: GuestObserver, path: str, scope: Scope) -> Any:
    """The observer's answer for `path`, or None when it is not one of its routes."""
    query = parse_qs(scope.get("query_string", b"").decode())

    def number(name: str) -> float | None:
        try:
            return float(query[name][0]) if name in query else None
        except ValueError:
            return None

    parts = path.strip("/").split("/")
    if parts == ["sandboxes", "metrics"]:
        ids = [i for v in query.get("ids", []) for i in v.split(",") if i]
        return {"sandboxes": observer.latest(ids)}
    if len(parts) == 3 and parts[0] == "sandboxes" and parts[2] == "metrics":
        return observer.metrics(parts[1], number("start"), number("end"))
    if len(parts) == 3 and parts[0] == "sandboxes" and parts[2] == "logs":
        return observer.logs(parts[1])
    return None


def node_proxy(
    host: Host,
    ingress: Ingress,
    ready: Callable[[], bool],
    observer: GuestObserver | None = None,
    *,
    exposition: Exposition | None = None,
    metrics_token: str | None = None,
    volumes: App | None = None,
) -> SandboxProxy:
    """This node's proxy; `ingress` says who may reach a sandbox's guest ports. A VM that
    runs but is not routed yet is not reachable: its token (if any) is not known here.
    `exposition`: the node's `/metrics`, for whoever sends `metrics_token` (no token: no
    one)."""

    async def resolve(sandbox_id: str, port: int, _token: str | None) -> Upstream:
        address = host.upstream(sandbox_id)
        routed, digest = ingress(sandbox_id)
        if address is None or not routed:
            raise SandboxUnavailable(sandbox_id)
        return Upstream(address, port, traffic_digest=digest)

    proxy = SandboxProxy(
        _node_routes(ready, observer, lambda: _status(host), exposition, metrics_token, volumes),
        resolve,
    )
    host.on_gone(lambda sid: _cut(proxy, sid))
    return proxy


def _cut(proxy: SandboxProxy, sandbox_id: str) -> None:
    """The VM is gone from this node: every stream to it ends (none can stay)."""
    proxy.close_sandbox(sandbox_id)


def listen(host: str, port: int) -> socket.socket:
    """The proxy's socket, bound before the server starts so port 0 gets a real number."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


__all__ = ["listen", "node_proxy"]
