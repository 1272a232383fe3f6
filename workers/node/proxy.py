"""The node's own sandbox proxy: `api proxy -> node -> guest` when the API runs elsewhere.

A guest's address (the netns end of its veth) is reachable only from its node's host, so
an API on another host sends sandbox traffic here, with `E2b-Sandbox-Id`/`-Port` saying
where it goes (`shared.proxy.RouteTable` with `via_node`); this proxy resolves them against
the VMs this node runs. It serves the same streaming proxy (HTTP and WebSocket) as the API.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

from shared.proxy import Receive, SandboxProxy, SandboxUnavailable, Scope, Send, Upstream
from workers.node.ports import Host


async def _not_sandbox_traffic(scope: Scope, receive: Receive, send: Send) -> None:
    """Anything without a sandbox target: this port serves sandbox traffic only."""
    if scope["type"] != "http":
        return
    body = json.dumps({"code": 404, "message": "node proxy: no E2b-Sandbox-Id"}).encode()
    await send({"type": "http.response.start", "status": 404,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


#: (routed, traffic digest) of a sandbox: what its route says (`RoutePublisher.ingress`)
Ingress = Callable[[str], tuple[bool, str | None]]


def node_proxy(host: Host, ingress: Ingress) -> SandboxProxy:
    """This node's proxy; `ingress` says who may reach a sandbox's guest ports. A VM that
    runs but is not routed yet is not reachable: its token (if any) is not known here."""

    async def resolve(sandbox_id: str, port: int, _token: str | None) -> Upstream:
        address = host.upstream(sandbox_id)
        routed, digest = ingress(sandbox_id)
        if address is None or not routed:
            raise SandboxUnavailable(sandbox_id)
        return Upstream(address, port, traffic_digest=digest)

    proxy = SandboxProxy(_not_sandbox_traffic, resolve)
    host.on_gone(proxy.close_sandbox)
    return proxy


def listen(host: str, port: int) -> socket.socket:
    """The proxy's socket, bound before the server starts so port 0 gets a real number."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


__all__ = ["listen", "node_proxy"]
