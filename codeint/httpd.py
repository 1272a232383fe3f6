"""A small asyncio HTTP/1.1 server: JSON answers and one streamed (chunked) answer kind.

The guest's Debian has no web framework we want to depend on, and the protocol needs
little: requests with a JSON body, JSON or plain answers, and `/execute`'s NDJSON stream,
whose client hanging up must be noticed while the kernel is silent (the SDK's `timeout`
is its read timeout: it gives up by closing the connection, and E2B's server then
interrupts the kernel). Keep-alive is kept; pipelining is not needed by any client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

MAX_BODY = 64 * 1024 * 1024  # code and env vars; a notebook cell is far below this
MAX_HEADER_LINES = 100
REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class HttpError(Exception):
    """An answer with a status and a plain message (what the SDK shows in its exception)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    responded: bool = False
    keep_alive: bool = True
    _hangup: asyncio.Task[bytes] | None = field(default=None, repr=False)

    def json(self) -> dict[str, Any]:
        if not self.body.strip():
            return {}
        try:
            doc = json.loads(self.body)
        except ValueError as e:
            raise HttpError(400, f"invalid JSON body: {e}") from e
        if not isinstance(doc, dict):
            raise HttpError(400, "the body must be a JSON object")
        return doc

    async def respond(
        self, status: int, body: bytes = b"", content_type: str = "text/plain; charset=utf-8"
    ) -> None:
        head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}"]
        if status != 204:
            head += [f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
        head.append("Connection: keep-alive" if self.keep_alive else "Connection: close")
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        self.responded = True
        await self.writer.drain()

    async def respond_json(self, status: int, doc: object) -> None:
        await self.respond(status, json.dumps(doc).encode(), "application/json")

    # ---- streamed answers ----------------------------------------------------------------
    async def start_stream(self, content_type: str = "application/x-ndjson") -> None:
        self.writer.write(
            (
                "HTTP/1.1 200 OK\r\n"
                f"Content-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n"
                "Cache-Control: no-store\r\n"
                f"Connection: {'keep-alive' if self.keep_alive else 'close'}\r\n\r\n"
            ).encode()
        )
        self.responded = True
        await self.writer.drain()

    async def send_chunk(self, data: bytes) -> None:
        """One chunk; raises ConnectionError once the client is gone."""
        if self.writer.is_closing():
            raise ConnectionResetError("client gone")
        self.writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await self.writer.drain()

    async def end_stream(self) -> None:
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()

    def hangup(self) -> asyncio.Task[bytes]:
        """A task that ends when the client closes its side (or sends anything, which no
        client of a streamed answer does): how a silent execution learns it was given up."""
        if self._hangup is None:
            self._hangup = asyncio.ensure_future(self.reader.read(1))
        return self._hangup


Handler = Callable[[Request], Awaitable[None]]


async def _read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> Request | None:
    line = await reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "bad request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADER_LINES):
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    else:
        raise HttpError(400, "too many headers")
    body = b""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader)
    elif (n := headers.get("content-length")) is not None:
        if not n.isdigit() or int(n) > MAX_BODY:
            raise HttpError(413, "body too large")
        body = await reader.readexactly(int(n))
    keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
    path = target.split("?", 1)[0]
    return Request(method, path, headers, body, reader, writer, keep_alive=keep)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return bytes(out)
        if len(out) + size > MAX_BODY:
            raise HttpError(413, "body too large")
        out += await reader.readexactly(size)
        await reader.readline()


async def serve_connection(
    handler: Handler, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Requests of one connection, one after the other, until either side closes."""
    try:
        while True:
            try:
                req = await _read_request(reader, writer)
            except HttpError as e:
                writer.write(
                    f"HTTP/1.1 {e.status} {REASONS.get(e.status, 'Error')}\r\n"
                    f"Content-Length: {len(e.message)}\r\nConnection: close\r\n\r\n"
                    f"{e.message}".encode()
                )
                await writer.drain()
                return
            if req is None:
                return
            try:
                await handler(req)
            except HttpError as e:
                if req.responded:
                    return
                await req.respond(e.status, e.message.encode())
            if not req.keep_alive or req._hangup is not None:
                return  # a streamed answer's hang-up watch owns the reader now
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return
    finally:
        with contextlib.suppress(Exception):
            writer.close()
