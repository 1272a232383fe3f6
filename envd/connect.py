"""Connect protocol v1 (JSON codec) over our HTTP/1.1 server: unary and streaming calls.

Wire rules, from the Connect spec and checked against connectrpc 0.12.1 (the client inside
e2b 2.63.0): unary is `application/json` in and out, errors are a non-200 status with
`{"code": "<snake_case>", "message": ...}`; streams are `application/connect+json` (exactly,
no parameters) made of 5-byte-prefixed envelopes, closed by an end-of-stream envelope
(flag 0x02) that carries `{}` or `{"error": {...}}`. A streaming response is always 200: errors
go into the end-of-stream envelope, which every Connect client understands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from envd import log
from envd.httpserver import Request

STREAM_CONTENT_TYPE = "application/connect+json"
UNARY_CONTENT_TYPE = "application/json"
FLAG_END_STREAM = 0x02
FLAG_COMPRESSED = 0x01
MAX_MESSAGE = 16 * 1024 * 1024
DEFAULT_KEEPALIVE_S = 90.0  # envd's default when the client does not ask for one

# Connect code -> HTTP status, as the Connect spec maps them.
CODE_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


class RpcError(Exception):
    """A Connect error: `code` is one of CODE_STATUS's keys."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


if sys.version_info >= (3, 11):  # noqa: UP036 - guests may run 3.9/3.10

    async def next_item(queue: asyncio.Queue[Any], timeout: float) -> Any:
        """queue.get() bounded by `timeout` (asyncio.TimeoutError); no extra task on 3.11+."""
        async with asyncio.timeout(timeout):
            return await queue.get()

else:  # Python 3.9/3.10 guests (images built from older OCI bases)

    async def next_item(queue: asyncio.Queue[Any], timeout: float) -> Any:
        return await asyncio.wait_for(queue.get(), timeout)


def envelope(data: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(data)) + data


def encode(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode()


def end_of_stream(error: RpcError | None) -> bytes:
    body = encode({"error": error.to_json()}) if error else b"{}"
    return envelope(body, FLAG_END_STREAM)


class EnvelopeParser:
    """Splits a byte stream into (flags, payload) envelopes, across arbitrary chunking."""

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self._buf = bytearray()
        self._max = max_message

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while len(self._buf) >= 5:
            flags, length = struct.unpack_from(">BI", self._buf, 0)
            if length > self._max:
                raise RpcError("resource_exhausted", f"message of {length} bytes is too large")
            if len(self._buf) < 5 + length:
                break
            out.append((flags, bytes(self._buf[5 : 5 + length])))
            del self._buf[: 5 + length]
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)


def decode_message(payload: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(payload) if payload.strip() else {}
    except ValueError as e:
        raise RpcError("invalid_argument", f"invalid JSON message: {e}") from e
    if not isinstance(msg, dict):
        raise RpcError("invalid_argument", "message must be a JSON object")
    return msg


@dataclass
class Call:
    """What a handler may need to know about the call besides its message."""

    req: Request
    timeout_s: float | None
    keepalive_s: float

    @property
    def headers(self) -> dict[str, str]:
        return self.req.headers


class Send(Protocol):
    """Sends protobuf-JSON payloads as envelopes, in one write, flushed."""

    async def __call__(self, *payloads: bytes) -> None: ...


UnaryHandler = Callable[[Call, dict[str, Any]], Awaitable[dict[str, Any]]]
ServerStreamHandler = Callable[[Call, dict[str, Any], Send], Awaitable[None]]
ClientStreamHandler = Callable[[Call, AsyncIterator[dict[str, Any]]], Awaitable[dict[str, Any]]]
BidiStreamHandler = Callable[[Call, AsyncIterator[dict[str, Any]], Send], Awaitable[None]]


def make_call(req: Request) -> Call:
    timeout_s: float | None = None
    raw = req.headers.get("connect-timeout-ms")
    if raw:
        if not raw.isdigit() or len(raw) > 10:
            raise RpcError("invalid_argument", f"invalid Connect-Timeout-Ms {raw!r}")
        timeout_s = int(raw) / 1000.0
    keepalive = DEFAULT_KEEPALIVE_S
    raw_ka = req.headers.get("keepalive-ping-interval")
    if raw_ka:
        with contextlib.suppress(ValueError):
            keepalive = max(0.05, float(raw_ka))
    return Call(req, timeout_s, keepalive)


def _internal(e: BaseException, path: str) -> RpcError:
    log.error("rpc handler failed", path=path, error=repr(e))
    return RpcError("internal", f"internal error: {type(e).__name__}")


async def serve_unary(req: Request, handler: UnaryHandler) -> None:
    try:
        ctype = req.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if ctype not in (UNARY_CONTENT_TYPE, ""):
            raise RpcError("unimplemented", f"unsupported content-type {ctype!r}; use JSON")
        call = make_call(req)
        body = await req.read_all(MAX_MESSAGE)
        result = await handler(call, decode_message(body))
    except RpcError as e:
        await req.respond(CODE_STATUS.get(e.code, 500), encode(e.to_json()), UNARY_CONTENT_TYPE)
        return
    except (ConnectionError, asyncio.IncompleteReadError):
        raise
    except Exception as e:
        err = _internal(e, req.path)
        await req.respond(500, encode(err.to_json()), UNARY_CONTENT_TYPE)
        return
    await req.respond(200, encode(result), UNARY_CONTENT_TYPE)


async def _read_messages(req: Request) -> AsyncIterator[dict[str, Any]]:
    parser = EnvelopeParser()
    while True:
        data = await req.read()
        if not data:
            if parser.pending:
                raise RpcError("invalid_argument", "truncated envelope at end of request")
            return
        for flags, payload in parser.feed(data):
            if flags & FLAG_COMPRESSED:
                raise RpcError("unimplemented", "compressed messages are not supported")
            if flags & FLAG_END_STREAM:
                continue
            yield decode_message(payload)


async def _first_message(req: Request) -> dict[str, Any]:
    """The single request message of a server-streaming call."""
    parser = EnvelopeParser()
    while True:
        data = await req.read()
        if not data:
            raise RpcError("invalid_argument", "missing request message")
        for flags, payload in parser.feed(data):
            if flags & FLAG_COMPRESSED:
                raise RpcError("unimplemented", "compressed messages are not supported")
            if not flags & FLAG_END_STREAM:
                return decode_message(payload)


def _check_stream_type(req: Request) -> None:
    ctype = req.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype != STREAM_CONTENT_TYPE:
        raise RpcError("unimplemented", f"unsupported content-type {ctype!r}")


async def serve_server_stream(req: Request, handler: ServerStreamHandler) -> None:
    """One request message in, a flushed envelope per message out, then end-of-stream.

    While the handler runs we also watch the socket: EOF means the client dropped the stream
    (`CommandHandle.disconnect()`), and the handler is cancelled — the process lives on.
    """
    try:
        call, first = await _open_server_stream(req)
    except RpcError as e:
        out = await req.begin_chunked(200, STREAM_CONTENT_TYPE)
        out.write_nowait(end_of_stream(e))
        await out.end()
        return
    conn = req.conn
    out = await req.begin_chunked(200, STREAM_CONTENT_TYPE)

    async def send(*payloads: bytes) -> None:
        out.write_nowait(b"".join(envelope(p) for p in payloads))
        await conn.drain()

    task = asyncio.ensure_future(handler(call, first, send))
    watch: asyncio.Future[None] | None = None
    if req.body_done and not req.close_after:
        watch = asyncio.ensure_future(conn.wait_readable())
    try:
        outcome = await _wait_handler(req, task, watch, call.timeout_s)
        if outcome == "gone":
            return
        if outcome == "deadline":
            error: RpcError | None = RpcError("deadline_exceeded", "the operation timed out")
        else:
            exc = task.exception()
            if isinstance(exc, ConnectionError):
                req.close_after = True
                return
            error = _as_rpc_error(exc, req.path)
        out.write_nowait(end_of_stream(error))
        await out.end()
    finally:
        if watch is not None:
            # Must be finished before the connection reads its next request: a pending
            # read on the StreamReader would make that read fail.
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        if not task.done():
            task.cancel()


async def _open_server_stream(req: Request) -> tuple[Call, dict[str, Any]]:
    """The call and its one request message, the request body read to its end."""
    _check_stream_type(req)
    call = make_call(req)
    first = await _first_message(req)
    if not req.body_done:
        # Finish reading what should be an already-sent end of body (a 0-length chunk).
        try:
            await asyncio.wait_for(req.drain_body(), 0.05)
        except asyncio.TimeoutError:  # noqa: UP041 - not an alias before 3.11
            req.close_after = True
    return call, first


async def _wait_handler(
    req: Request,
    task: asyncio.Future[None],
    watch: asyncio.Future[None] | None,
    timeout_s: float | None,
) -> Literal["done", "deadline", "gone"]:
    """How the handler's run ended: "done" (finished, its result or error in `task`),
    "deadline" (the call's timeout passed) or "gone" (the client hung up); the handler is
    cancelled in the last two."""
    waiting: set[asyncio.Future[Any]] = {task}
    if watch is not None:
        waiting.add(watch)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return "done"
        if not done:
            await _cancel(task)
            return "deadline"
        # The socket became readable: EOF, or pipelined bytes (unsupported: close after
        # this response). Either way the watch is spent.
        waiting.difference_update(done)
        req.close_after = True
        if req.conn.at_eof():  # client went away: stop streaming, keep the process
            await _cancel(task)
            return "gone"


async def _cancel(task: asyncio.Future[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _as_rpc_error(exc: BaseException | None, path: str) -> RpcError | None:
    """The end-of-stream error for how a handler ended (None: it succeeded)."""
    if exc is None or isinstance(exc, RpcError):
        return exc
    return _internal(exc, path)


async def serve_client_stream(req: Request, handler: ClientStreamHandler) -> None:
    """Many request messages in (as they arrive), one response message out."""
    error: RpcError | None = None
    result: dict[str, Any] | None = None
    try:
        _check_stream_type(req)
        call = make_call(req)
        coro = handler(call, _read_messages(req))
        if call.timeout_s is not None:
            result = await asyncio.wait_for(coro, call.timeout_s)
        else:
            result = await coro
    except RpcError as e:
        error = e
    except asyncio.TimeoutError:  # noqa: UP041 - not an alias before 3.11
        error = RpcError("deadline_exceeded", "the operation timed out")
    except (ConnectionError, asyncio.IncompleteReadError):
        raise
    except Exception as e:
        error = _internal(e, req.path)
    if not req.body_done:
        req.close_after = True
    out = await req.begin_chunked(200, STREAM_CONTENT_TYPE)
    if result is not None and error is None:
        out.write_nowait(envelope(encode(result)))
    out.write_nowait(end_of_stream(error))
    await out.end()


async def serve_bidi_stream(req: Request, handler: BidiStreamHandler) -> None:
    """Messages in as they arrive and out as they are produced, over one HTTP/1.1 exchange
    (full duplex: the response starts before the request body ends). envd's protos have no
    bidi method today; this keeps the Connect layer complete for when one appears."""
    error: RpcError | None = None
    call: Call | None = None
    try:
        _check_stream_type(req)
        call = make_call(req)
    except RpcError as e:
        error = e
    conn = req.conn
    out = await req.begin_chunked(200, STREAM_CONTENT_TYPE)

    async def send(*payloads: bytes) -> None:
        out.write_nowait(b"".join(envelope(p) for p in payloads))
        await conn.drain()

    if call is not None:
        try:
            coro = handler(call, _read_messages(req), send)
            if call.timeout_s is not None:
                await asyncio.wait_for(coro, call.timeout_s)
            else:
                await coro
        except RpcError as e:
            error = e
        except asyncio.TimeoutError:  # noqa: UP041 - not an alias before 3.11
            error = RpcError("deadline_exceeded", "the operation timed out")
        except (ConnectionError, asyncio.IncompleteReadError):
            req.close_after = True
            return
        except Exception as e:
            error = _internal(e, req.path)
    if not req.body_done:
        req.close_after = True
    out.write_nowait(end_of_stream(error))
    await out.end()
