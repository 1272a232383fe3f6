"""A small HTTP/1.1 server on asyncio (see conn.py): all envd needs, nothing more.

The stdlib has no asyncio HTTP server, and envd may not pull in third-party packages. What
E2B clients need from it: keep-alive, chunked request bodies (every streaming RPC sends one),
chunked responses flushed per write (a command's first `start` event must reach the client
at once), `Expect: 100-continue`, zero-copy file downloads, and bodies read incrementally so
a 1 GiB upload never sits in memory.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO

from envd import log
from envd.conn import Connection

MAX_HEAD = 64 * 1024
# Body reads stay cache-sized; bigger pieces measured slower for uploads.
READ_SIZE = 256 * 1024
# A reader asking for more than this of a body at least this big gets a big receive buffer.
BIG_BODY = 256 * 1024
BIG_BUFFER = 1024 * 1024
_EMPTY = bytearray()  # the span of an ended body (never written to)
# A handler that leaves more than this unread closes the connection instead of draining it.
MAX_DRAIN = 1024 * 1024

REASONS = {
    100: "Continue",
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    411: "Length Required",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    499: "Client Closed Request",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    507: "Insufficient Storage",
}


class HttpError(Exception):
    """An error answered as envd's plain JSON error body `{"code": <status>, "message": ...}`,
    or with `plain` as Go's `http.Error` answers (text, what envd's generated router says
    of a parameter it cannot bind)."""

    def __init__(self, status: int, message: str, *, plain: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.plain = plain


class BadRequest(Exception):
    """The bytes on the wire are not HTTP we understand; the connection is closed."""


class Request:
    """One request on a connection: its head, its body as an incremental reader, and the
    means to answer it exactly once."""

    def __init__(
        self,
        conn: Connection,
        method: str,
        target: str,
        version: str,
        headers: dict[str, str],
    ) -> None:
        self.conn = conn
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
        if target.startswith(("http://", "https://")):
            slash = target.find("/", target.find("//") + 2)
            target = target[slash:] if slash >= 0 else "/"
        path, _, self.query_string = target.partition("?")
        if "%" in path:
            from urllib.parse import unquote

            path = unquote(path)
        self.path = path
        self._query: dict[str, str] | None = None
        connection = headers.get("connection", "").lower()
        if version == "HTTP/1.0":
            self.keep_alive = "keep-alive" in connection
        else:
            self.keep_alive = "close" not in connection
        te = headers.get("transfer-encoding", "").lower()
        self.chunked = "chunked" in te
        if self.chunked:
            self._remaining = 0  # bytes left in the current chunk
        else:
            cl = headers.get("content-length", "0").strip() or "0"
            if not cl.isdigit():
                raise BadRequest("invalid content-length")
            self._remaining = int(cl)
        self.body_done = not self.chunked and self._remaining == 0
        self._crlf_due = False
        self._expect_continue = headers.get("expect", "").lower() == "100-continue"
        self.responded = False
        self.close_after = False

    # --- query ------------------------------------------------------------------------

    @property
    def query(self) -> dict[str, str]:
        if self._query is None:
            from urllib.parse import parse_qsl

            self._query = {}
            for k, v in parse_qsl(self.query_string, keep_blank_values=True):
                self._query.setdefault(k, v)
        return self._query

    # --- body ---------------------------------------------------------------------------

    async def read(self, max_bytes: int = READ_SIZE) -> bytes:
        """Next piece of the (de-chunked) body, at most max_bytes; b"" once it has ended."""
        view = await self.read_view(max_bytes)
        data = bytes(view)
        view.release()
        return data

    async def read_view(self, max_bytes: int = READ_SIZE) -> memoryview:
        """Like read(), without a copy: a view into the connection's buffer, valid until
        the next read. Uploads write it straight to the file."""
        buf, start, end = await self.read_span(max_bytes)
        return memoryview(buf)[start:end]

    async def read_span(self, max_bytes: int = READ_SIZE) -> tuple[bytearray, int, int]:
        """Like read_view(), as (buffer, start, end) of the connection's buffer, so a parser
        can search the bytes where they are (the multipart parser does); valid until the
        next read. start == end once the body has ended."""
        if self.body_done:
            return _EMPTY, 0, 0
        conn = self.conn
        if self._expect_continue:
            self._expect_continue = False
            conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if max_bytes > BIG_BODY and (self.chunked or self._remaining > BIG_BODY):
            conn.reserve(BIG_BUFFER)
        if not self.chunked:
            buf, start, end = await conn.read_span(min(self._remaining, max_bytes))
            if start == end:
                raise ConnectionResetError("client closed the connection mid-body")
            self._remaining -= end - start
            if self._remaining == 0:
                self.body_done = True
            return buf, start, end
        if self._crlf_due:  # after the previous chunk's data, consumed now: see below
            if await conn.readexactly(2) != b"\r\n":
                raise BadRequest("missing CRLF after chunk data")
            self._crlf_due = False
        while self._remaining == 0:
            line = await conn.readuntil(b"\r\n", MAX_HEAD)
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError as e:
                raise BadRequest("invalid chunk size") from e
            if size == 0:
                while (await conn.readuntil(b"\r\n", MAX_HEAD)) != b"\r\n":
                    pass  # trailers: ignored
                self.body_done = True
                return _EMPTY, 0, 0
            self._remaining = size
        buf, start, end = await conn.read_span(min(self._remaining, max_bytes))
        if start == end:
            raise ConnectionResetError("client closed the connection mid-body")
        self._remaining -= end - start
        # The CRLF that ends the chunk is read on the next call: reading it now could wait
        # for the socket, and the buffer may move under the span we return.
        self._crlf_due = self._remaining == 0
        return buf, start, end

    async def read_all(self, limit: int) -> bytes:
        """The whole body, refused with 413 beyond `limit` bytes (unary RPCs, /init)."""
        parts: list[bytes] = []
        total = 0
        while True:
            data = await self.read()
            if not data:
                return b"".join(parts)
            total += len(data)
            if total > limit:
                raise HttpError(413, f"request body larger than {limit} bytes")
            parts.append(data)

    async def drain_body(self) -> bool:
        """Discard what the handler left unread so the connection can be reused."""
        drained = 0
        while not self.body_done:
            data = await self.read()
            drained += len(data)
            if drained > MAX_DRAIN:
                return False
        return True

    # --- response -----------------------------------------------------------------------

    def _head(self, status: int, headers: list[tuple[str, str]]) -> bytes:
        if self.responded:
            raise RuntimeError("response already started")
        self.responded = True
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}"]
        lines.extend(f"{k}: {v}" for k, v in headers)
        if not self.keep_alive or self.close_after:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def respond(
        self,
        status: int,
        body: bytes = b"",
        content_type: str | None = None,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        """A complete response with a Content-Length (no length for 204)."""
        hdrs = list(headers or ())
        if content_type:
            hdrs.append(("Content-Type", content_type))
        if status != 204:
            hdrs.append(("Content-Length", str(len(body))))
        self.conn.write(self._head(status, hdrs) + body)
        await self.conn.drain()

    async def respond_json(self, status: int, obj: Any) -> None:
        body = json.dumps(obj, separators=(",", ":")).encode()
        await self.respond(status, body, "application/json")

    async def respond_error(self, status: int, message: str) -> None:
        """envd's plain error shape; the SDK maps it by status (401: AuthenticationException)."""
        await self.respond_json(status, {"code": status, "message": message})

    async def respond_text_error(self, status: int, message: str) -> None:
        """An error as Go's `http.Error` writes it: a line of text, not to be sniffed."""
        headers = [("X-Content-Type-Options", "nosniff")]
        body = (message + "\n").encode()
        await self.respond(status, body, "text/plain; charset=utf-8", headers=headers)

    async def begin_chunked(
        self, status: int, content_type: str, headers: list[tuple[str, str]] | None = None
    ) -> ChunkedWriter:
        hdrs = [("Content-Type", content_type), ("Transfer-Encoding", "chunked")]
        hdrs.extend(headers or ())
        self.conn.write(self._head(status, hdrs))
        return ChunkedWriter(self.conn)

    async def respond_file(
        self, status: int, f: BinaryIO, size: int, headers: list[tuple[str, str]]
    ) -> None:
        """Send a whole file with sendfile(2) when the transport allows it.

        A file truncated after its size was read ends early: the connection is then closed,
        so the client sees a short body at once instead of waiting for bytes that will
        never come (it would hang until its read timeout)."""
        hdrs = [*headers, ("Content-Length", str(size))]
        self.conn.write(self._head(status, hdrs))
        await self.conn.drain()
        if size:
            loop = asyncio.get_running_loop()
            assert self.conn.transport is not None
            sent = await loop.sendfile(self.conn.transport, f, 0, size, fallback=True)
            if sent < size:
                log.warn("file shrank while it was sent", announced=size, sent=sent)
                self.close_after = True


class ChunkedWriter:
    """Writes each piece as one HTTP chunk and hands it to the socket at once."""

    def __init__(self, writer: Connection) -> None:
        self._writer = writer

    def write_nowait(self, data: bytes) -> None:
        if data:
            self._writer.write(b"%x\r\n%b\r\n" % (len(data), data))

    async def write(self, data: bytes) -> None:
        self.write_nowait(data)
        await self._writer.drain()

    async def end(self) -> None:
        self._writer.write(b"0\r\n\r\n")
        await self._writer.drain()


Handler = Callable[[Request], Awaitable[None]]


def _parse_head(conn: Connection, head: bytes) -> Request:
    text = head.decode("latin-1")
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"bad request line {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest("bad header line")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return Request(conn, parts[0], parts[1], parts[2], headers)


async def serve_connection(conn: Connection, handler: Handler) -> None:
    """Serve requests on one keep-alive connection until either side closes it."""
    try:
        while True:
            conn.shrink_if_idle()
            try:
                head = await conn.readuntil(b"\r\n\r\n", MAX_HEAD)
            except asyncio.IncompleteReadError:
                return
            except asyncio.LimitOverrunError:
                conn.write(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
                )
                return
            req = _parse_head(conn, head)
            await handler(req)
            if not req.keep_alive or req.close_after:
                return
            if not await req.drain_body():
                return
    except BadRequest as e:
        log.warn("bad http request", error=str(e))
        conn.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        pass
    finally:
        conn.close()
