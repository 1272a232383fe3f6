"""The buffered connection protocol, driven through its protocol callbacks (no sockets)."""

from __future__ import annotations

import asyncio

import pytest

from envd import conn as conn_mod
from envd.conn import Connection


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.paused = False
        self.written = bytearray()
        self.closed = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


def feed(c: Connection, data: bytes) -> None:
    """What the event loop does: recv_into get_buffer(), then buffer_updated()."""
    while data:
        buf = c.get_buffer(-1)
        n = min(len(buf), len(data))
        buf[:n] = data[:n]
        c.buffer_updated(n)
        data = data[n:]


async def _idle(c: Connection) -> None:
    return None


async def make() -> tuple[Connection, FakeTransport]:
    c = Connection(_idle)
    t = FakeTransport()
    c.connection_made(t)
    await asyncio.sleep(0)
    return c, t


async def test_readuntil_across_pieces_and_eof() -> None:
    c, _ = await make()
    feed(c, b"GET / HTTP/1.1\r\nHost: x\r")
    task = asyncio.ensure_future(c.readuntil(b"\r\n\r\n", 1000))
    await asyncio.sleep(0)
    assert not task.done()
    feed(c, b"\n\r\nrest")
    assert await task == b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    assert await c.read(100) == b"rest"
    c.eof_received()
    assert await c.read(100) == b""
    with pytest.raises(asyncio.IncompleteReadError):
        await c.readuntil(b"\r\n", 10)


async def test_readuntil_limit() -> None:
    c, _ = await make()
    feed(c, b"x" * 50)
    with pytest.raises(asyncio.LimitOverrunError):
        await c.readuntil(b"\r\n", 10)


async def test_flow_control_and_compaction(monkeypatch: pytest.MonkeyPatch) -> None:
    c, t = await make()
    payload = bytes(range(256)) * (conn_mod.HIGH_WATER // 256)
    feed(c, payload)
    assert t.paused  # high water reached: the socket is no longer read
    got = bytearray()
    while len(got) < len(payload):
        view = await c.read_view(100_000)
        got += view
        view.release()
    assert bytes(got) == payload
    assert not t.paused
    # a separator that arrives while readuntil waits, in a piece that compacts the buffer
    fill = conn_mod.CAPACITY - conn_mod.MIN_FREE + 10
    feed(c, b"a" * fill)
    await c.readexactly(fill - 3)
    task = asyncio.ensure_future(c.readuntil(b"\r\n", 100))
    await asyncio.sleep(0)
    assert not task.done()
    feed(c, b"\r\nnext")  # get_buffer() moves "aaa" to the front first
    assert await task == b"aaa\r\n"
    assert await c.read(10) == b"next"


async def test_wait_readable_does_not_consume() -> None:
    c, _ = await make()
    task = asyncio.ensure_future(c.wait_readable())
    await asyncio.sleep(0)
    assert not task.done()
    feed(c, b"z")
    await task
    assert not c.at_eof() and await c.read(5) == b"z"
    task = asyncio.ensure_future(c.wait_readable())
    await asyncio.sleep(0)
    c.connection_lost(None)
    await task
    assert c.at_eof()


async def test_drain_waits_for_resume_and_fails_when_lost() -> None:
    c, t = await make()
    c.write(b"hello")
    assert bytes(t.written) == b"hello"
    c.pause_writing()
    task = asyncio.ensure_future(c.drain())
    await asyncio.sleep(0)
    assert not task.done()
    c.resume_writing()
    await task
    c.pause_writing()
    task = asyncio.ensure_future(c.drain())
    await asyncio.sleep(0)
    c.connection_lost(None)
    with pytest.raises(ConnectionResetError):
        await task


async def test_buffer_grows_for_big_bodies_and_shrinks_when_idle() -> None:
    c, _ = await make()
    assert len(c.get_buffer(-1)) == conn_mod.SMALL
    feed(c, b"b" * (3 * conn_mod.SMALL))  # arrives faster than it is consumed
    assert c.buffered == 3 * conn_mod.SMALL
    view = await c.read_view(10)
    held = bytes(view)  # a consumer's view survives the buffer being replaced
    feed(c, b"c" * conn_mod.SMALL)
    assert bytes(view) == held == b"b" * 10
    view.release()
    assert await c.readexactly(4 * conn_mod.SMALL - 10) == b"b" * (3 * conn_mod.SMALL - 10) + (
        b"c" * conn_mod.SMALL
    )
    c.shrink_if_idle()
    assert len(c.get_buffer(-1)) == conn_mod.SMALL


async def test_reserve_keeps_unread_data() -> None:
    c, _ = await make()
    feed(c, b"head")
    c.reserve(1024 * 1024)
    assert len(c.get_buffer(-1)) == 1024 * 1024 - 4
    c.buffer_updated(0)
    assert await c.read(10) == b"head"
    c.reserve(64 * 1024 * 1024)  # capped
    assert len(c.get_buffer(-1)) == conn_mod.CAPACITY
