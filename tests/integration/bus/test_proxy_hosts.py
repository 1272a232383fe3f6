"""Sandbox ports by host name over TLS, through the real sandbox proxy: what a client that
never sets `E2B_SANDBOX_URL` sends (`https://{port}-{sandboxId}.{domain}`, `get_host`).

Real parts over loopback: routes in the real NATS KV bucket, the API's `RouteTable` and
`SandboxProxy` served by uvicorn with a certificate of the local CA `aenv up` makes, a
real HTTP + WebSocket server standing in for the guest port. The client connects to
127.0.0.1 and names the host in SNI and `Host`, as it would after resolving it.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest_asyncio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Event, RejectConnection, Request, TextMessage

from aenv.tls import local_certificate
from bus import Bus
from shared.proxy import Receive, RouteTable, SandboxProxy, Scope, Send
from tests.integration.bus.test_proxy_ingress import HEADER, MISSING, TOKEN, Guest, _route, serving
from workers.node.proxy import listen

DOMAIN = "aenv.localhost"


@dataclass
class Tls:
    domain: str  # with the port, as clients are given it
    port: int
    client: ssl.SSLContext
    guest: Guest
    guest_port: int
    api_calls: list[str]


@pytest_asyncio.fixture
async def tls(bus: Bus, tmp_path: Path) -> AsyncIterator[Tls]:
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    ca = local_certificate(tmp_path / "tls", f"{DOMAIN}:{port}")
    calls: list[str] = []

    async def control_plane(scope: Scope, receive: Receive, send: Send) -> None:
        calls.append(scope["path"])
        body = json.dumps({"api": scope["path"]}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    guest = Guest()
    table = await RouteTable.open(bus)
    proxy = SandboxProxy(control_plane, table.resolve, domain=f"{DOMAIN}:{port}")
    cert = {"ssl_certfile": ca.certificate.cert_file, "ssl_keyfile": ca.certificate.key_file}
    try:
        async with (
            serving(guest, listen("127.0.0.1", 0)) as guest_port,
            serving(proxy, sock, **cert),
        ):
            client = ssl.create_default_context(cafile=str(ca.ca_file))
            yield Tls(f"{DOMAIN}:{port}", port, client, guest, guest_port, calls)
    finally:
        await table.close()


async def _get(t: Tls, host: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """GET https://{host}/hello, connecting to the proxy on 127.0.0.1 (what the name
    resolves to on this machine), the name in SNI and Host as a resolving client sends it."""
    transport = httpx.AsyncHTTPTransport(verify=t.client)
    async with httpx.AsyncClient(transport=transport, timeout=10) as c:
        url = httpx.URL(f"https://127.0.0.1:{t.port}/hello")
        return await c.get(
            url,
            headers={"Host": f"{host}:{t.port}", **(headers or {})},
            extensions={"sni_hostname": host},
        )


async def test_a_guest_port_by_name_over_tls(bus: Bus, tls: Tls) -> None:
    sid = await _route(bus, private=False)
    r = await _get(tls, f"{tls.guest_port}-{sid}.{DOMAIN}")
    assert r.status_code == 200 and r.json() == {"path": "/hello"}
    assert tls.guest.seen == ["/hello"]
    r = await _get(tls, f"api.{DOMAIN}")  # the control plane, by its name
    assert r.status_code == 200 and r.json() == {"api": "/hello"}
    assert tls.api_calls == ["/hello"]


async def test_a_private_sandbox_by_name_asks_for_its_token(bus: Bus, tls: Tls) -> None:
    sid = await _route(bus, private=True)
    host = f"{tls.guest_port}-{sid}.{DOMAIN}"
    r = await _get(tls, host)
    assert r.status_code == 403
    assert r.json() == {"sandboxId": sid, "message": MISSING, "code": 403}
    assert tls.guest.seen == []
    r = await _get(tls, host, {HEADER: TOKEN})
    assert r.status_code == 200 and tls.guest.seen == ["/hello"]


async def test_names_that_reach_no_guest(bus: Bus, tls: Tls) -> None:
    """Not a 500, not a hang: E2B's 502 for a sandbox with no route (and no state), a
    400 for a name under the domain that names no port, before the control plane."""
    r = await _get(tls, f"8000-nosuchsandbox.{DOMAIN}")
    assert r.status_code == 502
    assert r.json() == {
        "sandboxId": "nosuchsandbox",
        "code": 502,
        "message": "The sandbox was not found",
    }
    r = await _get(tls, f"shop.{DOMAIN}")
    assert r.status_code == 400 and set(r.json()) == {"code", "message"}
    assert tls.api_calls == []


async def test_a_websocket_by_name_over_tls(bus: Bus, tls: Tls) -> None:
    """`wss://{port}-{id}.{domain}`: the upgrade is routed by the name, with the token
    rules of any request to a guest port."""
    sid = await _route(bus, private=True)
    host = f"{tls.guest_port}-{sid}.{DOMAIN}:{tls.port}"
    ev, ws = await _upgrade(tls, host, [])
    try:
        assert isinstance(ev, RejectConnection) and ev.status_code == 403, ev
    finally:
        ws[1].close()
    ev, ws = await _upgrade(tls, host, [(HEADER.encode(), TOKEN.encode())])
    try:
        assert isinstance(ev, AcceptConnection), ev
        conn, writer, reader = ws
        writer.write(conn.send(TextMessage(data="over tls")))
        ev = await _next(conn, reader)
        assert isinstance(ev, TextMessage) and ev.data == "echo:over tls"
    finally:
        ws[1].close()
    assert tls.guest.seen == ["ws:/chat"]


async def _upgrade(
    t: Tls, host: str, headers: list[tuple[bytes, bytes]]
) -> tuple[Event, tuple[WSConnection, asyncio.StreamWriter, asyncio.StreamReader]]:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", t.port, ssl=t.client, server_hostname=host.rsplit(":", 1)[0]
    )
    conn = WSConnection(ConnectionType.CLIENT)
    writer.write(conn.send(Request(host=host, target="/chat", extra_headers=headers)))
    return await _next(conn, reader), (conn, writer, reader)


async def _next(conn: WSConnection, reader: asyncio.StreamReader) -> Event:
    while True:
        for event in conn.events():
            return event
        data = await asyncio.wait_for(reader.read(65536), 10)
        if not data:
            raise ConnectionError("closed")
        conn.receive_data(data)
