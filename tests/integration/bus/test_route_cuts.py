"""Which proxied streams a route change cuts, against real JetStream and real sockets.

After a NATS restart the API's route watch replays each key's latest value only: a pause
and a resume on the same node, missed meanwhile, arrive as one "route changed". Cutting
every stream then broke a command's live stream to a guest that never went (a 502 "can't
handle event type ConnectionClosed" in the crash matrix). A change cuts the streams to a
target the new route no longer names; a deletion cuts them all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest_asyncio

from bus import Bus
from bus.routes import Route
from domain.sandbox.values import new_sandbox_id
from shared.proxy import RouteTable, SandboxProxy, Upstream
from shared.proxy.stream import StreamCut


async def eventually(probe: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not probe():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest_asyncio.fixture
async def table(bus: Bus) -> AsyncIterator[RouteTable]:
    t = await RouteTable.open(bus)
    try:
        yield t
    finally:
        await t.close()


async def test_a_change_to_the_same_target_keeps_its_streams(bus: Bus, table: RouteTable) -> None:
    calls: list[tuple[str, str | None]] = []
    table.on_gone.append(lambda sid, keep: calls.append((sid, keep)))
    sid = new_sandbox_id()
    await table.book.put(sid, Route(node_id="n1", address="10.9.0.2"))
    await eventually(lambda: sid in table.routes)
    # the same guest, another traffic token (a resume that drew a new one): keep it
    await table.book.put(sid, Route(node_id="n1", address="10.9.0.2", traffic_digest="d"))
    await eventually(lambda: len(calls) == 1)
    assert calls == [(sid, "guest:10.9.0.2")]
    await table.book.put(sid, Route(node_id="n2", address="10.9.0.6"))
    await eventually(lambda: len(calls) == 2)
    assert calls[-1] == (sid, "guest:10.9.0.6")
    await table.book.drop(sid)
    await eventually(lambda: len(calls) == 3)
    assert calls[-1] == (sid, None)


async def test_via_node_names_the_node_proxy(bus: Bus, table: RouteTable) -> None:
    through_nodes = RouteTable(bus, table.book, via_node=True)
    route = Route(node_id="n1", address="10.9.0.2", node_proxy="127.0.0.1:7001")
    assert through_nodes.via(route) == "node:127.0.0.1:7001"
    assert table.via(route) == "guest:10.9.0.2"


async def _endless_guest() -> tuple[asyncio.Server, int]:
    """A guest whose answer streams forever (a command's output), on loopback."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        try:
            while True:
                writer.write(b"5\r\nstep\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.05)
        except (ConnectionError, OSError):
            pass

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


class _Client:
    """One proxied request, driven as the ASGI server would."""

    def __init__(self, proxy: SandboxProxy, sid: str) -> None:
        self.chunks = 0
        self.cut = False
        scope = {
            "type": "http",
            "method": "GET",
            "path": "/stream",
            "headers": [(b"e2b-sandbox-id", sid.encode()), (b"e2b-sandbox-port", b"49983")],
        }
        self.task = asyncio.create_task(self._run(proxy, scope))
        self._gone = asyncio.Event()

    async def _run(self, proxy: SandboxProxy, scope: dict[str, Any]) -> None:
        async def receive() -> dict[str, Any]:
            if getattr(self, "_sent_body", False):
                await self._gone.wait()
                return {"type": "http.disconnect"}
            self._sent_body = True
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.body" and msg.get("body"):
                self.chunks += 1

        try:
            await proxy(scope, receive, send)
        except StreamCut:
            self.cut = True

    async def leave(self) -> None:
        self._gone.set()
        await asyncio.wait_for(self.task, 5)


async def test_the_proxy_cuts_only_the_streams_to_another_target() -> None:
    old_guest, old_port = await _endless_guest()
    new_guest, new_port = await _endless_guest()
    sid = new_sandbox_id()
    targets = iter([("guest:old", old_port), ("guest:new", new_port)])

    async def resolve(sandbox_id: str, port: int, token: str | None) -> Upstream:
        via, p = next(targets)
        return Upstream("127.0.0.1", p, via=via)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("sandbox traffic reached the control plane")

    proxy = SandboxProxy(app, resolve)
    old, new = _Client(proxy, sid), _Client(proxy, sid)
    try:
        await eventually(lambda: old.chunks > 2 and new.chunks > 2)
        assert proxy.close_sandbox(sid, keep_via="guest:new") == 1
        await asyncio.wait_for(old.task, 5)
        assert old.cut  # the client's stream broke off, not ended cleanly
        seen = new.chunks
        await eventually(lambda: new.chunks > seen + 2)  # still streaming
        assert not new.task.done()
        assert proxy.close_sandbox(sid) == 1  # gone: every stream
        await asyncio.wait_for(new.task, 5)
        assert new.cut
        assert proxy.close_sandbox(sid) == 0
    finally:
        for c in (old, new):
            if not c.task.done():
                await c.leave()
        for server in (old_guest, new_guest):
            server.close()
