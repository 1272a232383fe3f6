"""E2B's private ingress through the real sandbox proxy: `allowPublicTraffic=false` means a
guest port answers only requests that carry the sandbox's `e2b-traffic-access-token`.

Real parts over loopback: routes in the real NATS KV bucket (put by the node's own
`RoutePublisher` for the node-proxy case), the API's `RouteTable` and the node's proxy served
by uvicorn, and a real HTTP + WebSocket server on 127.0.0.1 standing in for the guest port.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import uvicorn
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Event, RejectConnection, Request, TextMessage

from bus import Bus
from bus.decisions import execute
from bus.routes import Route, RouteBook, traffic_digest
from domain import sandbox as sb
from domain.sandbox.values import new_sandbox_id
from shared.proxy import ASGIApp, Receive, RouteTable, SandboxProxy, Scope, Send
from shared.proxy.ingress import ENVD_PORT
from workers.node.memory import MemoryHost
from workers.node.ports import GuestConfig
from workers.node.proxy import listen, node_proxy
from workers.node.routes import RoutePublisher

TOKEN = "the-sandbox-traffic-token"
HEADER = "e2b-traffic-access-token"
MISSING = f"Sandbox is secured with traffic access token. Token header '{HEADER}' is missing"
INVALID = (
    f"Sandbox is secured with traffic access token. Provided token in header '{HEADER}' is invalid"
)


@dataclass
class Guest:
    """The guest port: answers HTTP with what it got, echoes WebSocket text."""

    seen: list[str] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append(scope["path"])
            body = json.dumps({"path": scope["path"]}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
        elif scope["type"] == "websocket":
            self.seen.append("ws:" + scope["path"])
            await receive()  # websocket.connect
            await send({"type": "websocket.accept"})
            msg = await receive()
            await send({"type": "websocket.send", "text": "echo:" + msg.get("text", "")})
            await send({"type": "websocket.close", "code": 1000})


async def _not_sandbox(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("every request here is sandbox traffic")


@contextlib.asynccontextmanager
async def serving(app: ASGIApp, sock: socket.socket, **tls: Path) -> AsyncIterator[int]:
    """`app` served on `sock` until the block ends; `tls`: uvicorn's `ssl_certfile` and
    `ssl_keyfile` (test_proxy_hosts serves by name over HTTPS)."""
    config = uvicorn.Config(app, lifespan="off", log_level="warning", **tls)  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), "server did not start"
            await asyncio.sleep(0.01)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task


@dataclass
class Proxy:
    url: str
    guest: Guest
    guest_port: int
    table: RouteTable


@pytest_asyncio.fixture
async def proxy(bus: Bus) -> AsyncIterator[Proxy]:
    """The API's proxy (routes straight to the guest address) in front of one guest."""
    guest = Guest()
    table = await RouteTable.open(bus)
    try:
        async with (
            serving(guest, listen("127.0.0.1", 0)) as guest_port,
            serving(SandboxProxy(_not_sandbox, table.resolve), listen("127.0.0.1", 0)) as port,
        ):
            yield Proxy(f"http://127.0.0.1:{port}", guest, guest_port, table)
    finally:
        await table.close()


async def _route(bus: Bus, *, private: bool) -> str:
    """A sandbox's route, as its node writes it (the guest's address, the token's digest)."""
    sid = new_sandbox_id()
    digest = traffic_digest(TOKEN) if private else None
    book = await RouteBook.open(bus.js, bus.names.routes_bucket)
    await book.put(sid, Route(node_id="n1", address="127.0.0.1", traffic_digest=digest))
    return sid


async def _get(url: str, sid: str, port: int, token: str | None = None) -> httpx.Response:
    headers = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(port)}
    if token is not None:
        headers[HEADER] = token
    async with httpx.AsyncClient(timeout=10) as c:
        return await c.get(f"{url}/hello", headers=headers)


async def test_a_private_sandbox_answers_only_with_its_token(bus: Bus, proxy: Proxy) -> None:
    sid = await _route(bus, private=True)
    r = await _get(proxy.url, sid, proxy.guest_port)
    assert r.status_code == 403
    assert r.json() == {"sandboxId": sid, "message": MISSING, "code": 403}
    r = await _get(proxy.url, sid, proxy.guest_port, "not-the-token")
    assert r.status_code == 403
    assert r.json() == {"sandboxId": sid, "message": INVALID, "code": 403}
    r = await _get(proxy.url, sid, proxy.guest_port, "")
    assert r.status_code == 403 and r.json()["message"] == MISSING
    assert proxy.guest.seen == []  # nothing reached the guest
    r = await _get(proxy.url, sid, proxy.guest_port, TOKEN)
    assert r.status_code == 200 and r.json() == {"path": "/hello"}
    assert proxy.guest.seen == ["/hello"]


async def test_a_public_sandbox_needs_no_token(bus: Bus, proxy: Proxy) -> None:
    sid = await _route(bus, private=False)
    assert (await _get(proxy.url, sid, proxy.guest_port)).status_code == 200
    assert (await _get(proxy.url, sid, proxy.guest_port, "whatever")).status_code == 200


async def test_envds_port_is_left_to_envd(bus: Bus, proxy: Proxy) -> None:
    """envd checks its own access token; the SDK never sends the traffic token there."""
    try:
        envd_sock = listen("127.0.0.1", ENVD_PORT)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        pytest.skip(f"127.0.0.1:{ENVD_PORT} is taken on this machine")
    envd = Guest()
    sid = await _route(bus, private=True)
    async with serving(envd, envd_sock):
        r = await _get(proxy.url, sid, ENVD_PORT)
    assert r.status_code == 200 and envd.seen == ["/hello"]


class WsClient:
    """A WebSocket client over asyncio streams (wsproto does the framing)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.ws = WSConnection(ConnectionType.CLIENT)

    @classmethod
    async def open(cls, url: str, headers: list[tuple[bytes, bytes]]) -> WsClient:
        host = url.removeprefix("http://")
        name, _, port = host.partition(":")
        c = cls(*await asyncio.open_connection(name, int(port)))
        c.writer.write(c.ws.send(Request(host=host, target="/chat", extra_headers=headers)))
        return c

    async def next_event(self) -> Event:
        while True:
            for event in self.ws.events():
                return event
            data = await asyncio.wait_for(self.reader.read(65536), 10)
            if not data:
                raise ConnectionError("closed")
            self.ws.receive_data(data)

    def send(self, event: Any) -> None:
        self.writer.write(self.ws.send(event))

    def close(self) -> None:
        self.writer.close()


async def test_a_websocket_upgrade_needs_the_token_too(bus: Bus, proxy: Proxy) -> None:
    sid = await _route(bus, private=True)
    target = [
        (b"e2b-sandbox-id", sid.encode()),
        (b"e2b-sandbox-port", str(proxy.guest_port).encode()),
    ]
    for bad in ([], [(HEADER.encode(), b"not-the-token")]):
        c = await WsClient.open(proxy.url, target + bad)
        try:
            ev = await c.next_event()
            assert isinstance(ev, RejectConnection) and ev.status_code == 403, ev
        finally:
            c.close()
    assert proxy.guest.seen == []
    c = await WsClient.open(proxy.url, [*target, (HEADER.encode(), TOKEN.encode())])
    try:
        assert isinstance(await c.next_event(), AcceptConnection)
        c.send(TextMessage(data="hi"))
        ev = await c.next_event()
        assert isinstance(ev, TextMessage) and ev.data == "echo:hi"
    finally:
        c.close()
    assert proxy.guest.seen == ["ws:/chat"]


async def test_no_one_without_the_token_wakes_a_private_paused_sandbox(bus: Bus) -> None:
    """With `autoResume`, the first request resumes a paused sandbox: a private one only
    for a request that carries its token (nothing is resumed for the others)."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    sid = new_sandbox_id()
    for cmd in (
        sb.CreateSandbox(
            sandbox_id=sid,
            template_id="base",
            at=at,
            timeout_s=60,
            lifecycle=sb.Lifecycle(on_timeout="pause", auto_resume=True),
            network=sb.NetworkPolicy(allow_public_traffic=False),
            traffic_access_token=TOKEN,
        ),
        sb.CompleteCreate(sandbox_id=sid, node_id="n1", at=at),
        sb.PauseSandbox(sandbox_id=sid, at=at),
        sb.CompletePause(sandbox_id=sid, snapshot_id=f"{sid}-p1", at=at),
    ):
        await execute(bus.sandboxes, cmd)
    resumed: list[str] = []
    book = await RouteBook.open(bus.js, bus.names.routes_bucket)

    async def policy(state: sb.Sandbox) -> None:  # what a node does, minus the VM
        resumed.append(state.sandbox_id)
        await execute(bus.sandboxes, sb.ResumeSandbox(sandbox_id=sid, at=at))
        await execute(bus.sandboxes, sb.CompleteResume(sandbox_id=sid, node_id="n1", at=at))
        await book.put(
            sid, Route(node_id="n1", address="127.0.0.1", traffic_digest=traffic_digest(TOKEN))
        )

    guest = Guest()
    table = await RouteTable.open(bus, resume=policy)
    try:
        async with (
            serving(guest, listen("127.0.0.1", 0)) as guest_port,
            serving(SandboxProxy(_not_sandbox, table.resolve), listen("127.0.0.1", 0)) as port,
        ):
            url = f"http://127.0.0.1:{port}"
            r = await _get(url, sid, guest_port)
            assert r.status_code == 403 and r.json()["message"] == MISSING
            r = await _get(url, sid, guest_port, "not-the-token")
            assert r.status_code == 403 and r.json()["message"] == INVALID
            assert resumed == [] and guest.seen == []
            assert (await _get(url, sid, guest_port, TOKEN)).status_code == 200
            assert resumed == [sid] and guest.seen == ["/hello"]
    finally:
        await table.close()


class LoopbackHost(MemoryHost):
    """The in-memory host, its guests' ports on 127.0.0.1 (the stand-in guest's)."""

    def upstream(self, sandbox_id: str) -> str | None:
        return "127.0.0.1" if self.runs(sandbox_id) else None


async def test_the_nodes_own_proxy_checks_the_token_as_well(bus: Bus) -> None:
    """The node's proxy is reachable without the API's: it asks for the token itself,
    from what its node put in the route; the API's proxy, via the node, passes it on."""
    guest = Guest()
    host = LoopbackHost(capacity=4)
    sid = new_sandbox_id()
    await host.create(sid, "base", GuestConfig())
    node_sock = listen("127.0.0.1", 0)
    publisher = await RoutePublisher.open(
        bus, host, "n-ingress", f"127.0.0.1:{node_sock.getsockname()[1]}"
    )
    table = await RouteTable.open(bus, via_node=True)
    try:
        async with (
            serving(guest, listen("127.0.0.1", 0)) as guest_port,
            serving(node_proxy(host, publisher.ingress, lambda: True), node_sock) as node_port,
            serving(SandboxProxy(_not_sandbox, table.resolve), listen("127.0.0.1", 0)) as api_port,
        ):
            node_url, api_url = f"http://127.0.0.1:{node_port}", f"http://127.0.0.1:{api_port}"
            # running, not routed yet: the node cannot know who may reach it
            assert (await _get(node_url, sid, guest_port, TOKEN)).status_code == 502
            await publisher.put(sid, TOKEN)
            for url in (node_url, api_url):
                r = await _get(url, sid, guest_port)
                assert r.status_code == 403 and r.json()["message"] == MISSING
                r = await _get(url, sid, guest_port, "not-the-token")
                assert r.status_code == 403 and r.json()["message"] == INVALID
            assert guest.seen == []
            for url in (node_url, api_url):
                assert (await _get(url, sid, guest_port, TOKEN)).status_code == 200
            assert guest.seen == ["/hello", "/hello"]
            # an upgrade's token goes on through the API's proxy to the node's
            target = [
                (b"e2b-sandbox-id", sid.encode()),
                (b"e2b-sandbox-port", str(guest_port).encode()),
            ]
            for token, accepted in ((None, False), (TOKEN, True)):
                sent = [] if token is None else [(HEADER.encode(), token.encode())]
                c = await WsClient.open(api_url, [*target, *sent])
                try:
                    ev = await c.next_event()
                    assert isinstance(ev, AcceptConnection if accepted else RejectConnection), ev
                    if accepted:
                        c.send(TextMessage(data="via node"))
                        ev = await c.next_event()
                        assert isinstance(ev, TextMessage) and ev.data == "echo:via node"
                finally:
                    c.close()
            assert guest.seen[-1] == "ws:/chat"
            await host.kill(sid)  # gone: so is what the node knew of its ingress
            assert publisher.ingress(sid) == (False, None)
    finally:
        await table.close()
        await publisher.dropped()
