"""Connect bidi streaming over HTTP/1.1, on envd's own server with an echo method.

envd's protos have no bidi RPC, so this drives the Connect layer directly: a response
message must arrive before the request body has ended (full duplex), and the end of the
request ends the stream with a clean end-of-stream envelope.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from envd.conn import Connection
from envd.connect import (
    FLAG_END_STREAM,
    Call,
    EnvelopeParser,
    RpcError,
    Send,
    encode,
    envelope,
    serve_bidi_stream,
)
from envd.httpserver import Request, serve_connection

pytestmark = pytest.mark.timeout(10)


async def echo(call: Call, messages: AsyncIterator[dict[str, Any]], send: Send) -> None:
    async for msg in messages:
        if msg.get("fail"):
            raise RpcError("invalid_argument", "asked to fail")
        await send(encode({"echo": msg["n"]}))


async def route(req: Request) -> None:
    await serve_bidi_stream(req, echo)


async def serve_one(conn: Connection) -> None:
    await serve_connection(conn, route)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


async def read_envelopes(
    reader: asyncio.StreamReader, parser: EnvelopeParser, want: int
) -> list[tuple[int, bytes]]:
    """De-chunk the response body until `want` envelopes arrived."""
    got: list[tuple[int, bytes]] = []
    while len(got) < want:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        data = await reader.readexactly(size + 2)
        got += parser.feed(data[:-2])
    return got


async def exchange(messages: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(serve_one), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST /x.Y/Echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/connect+json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        head = await reader.readuntil(b"\r\n\r\n")
        parser = EnvelopeParser()
        out: list[tuple[int, dict[str, Any]]] = []
        assert head.startswith(b"HTTP/1.1 200") and b"application/connect+json" in head
        for msg in messages:
            writer.write(chunk(envelope(json.dumps(msg).encode())))
            await writer.drain()
            if msg.get("fail"):
                break
            # full duplex: the answer comes while the request body is still open
            ((flags, payload),) = await read_envelopes(reader, parser, 1)
            out.append((flags, json.loads(payload)))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        ((flags, payload),) = await read_envelopes(reader, parser, 1)
        out.append((flags, json.loads(payload)))
        return out
    finally:
        writer.close()
        server.close()


async def test_bidi_echo_is_full_duplex() -> None:
    got = await exchange([{"n": 1}, {"n": 2}, {"n": 3}])
    assert got == [(0, {"echo": 1}), (0, {"echo": 2}), (0, {"echo": 3}), (FLAG_END_STREAM, {})]


async def test_bidi_error_ends_the_stream() -> None:
    got = await exchange([{"n": 1}, {"fail": True}])
    assert got[0] == (0, {"echo": 1})
    flags, last = got[-1]
    assert flags == FLAG_END_STREAM
    assert last == {"error": {"code": "invalid_argument", "message": "asked to fail"}}
