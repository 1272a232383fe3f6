"""The envd/guest-port proxy: raw ASGI in front of the control-plane app.

E2B SDKs send sandbox traffic to `E2B_SANDBOX_URL` (often the API's own URL) with
`E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers, or to `{port}-{id}.{domain}`. Such requests
never reach Litestar: they are streamed both ways to the guest, chunk by chunk, with no
buffering — a `commands.run(background=True)` returns only when the first streamed event
arrives, and a 1 GiB upload must not sit in this process's memory. WebSocket upgrades are
relayed message by message (`shared.proxy.websocket`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import h11

from shared.proxy.hosts import API_LABEL, sandbox_target, stray_host
from shared.proxy.ingress import presented_token, refusal
from shared.proxy.websocket import forward_websocket

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
    }
)
CONNECT_TIMEOUT = 5.0
#: The pauses between attempts to reach a port that refuses the connection. E2B's sandbox
#: proxy dials five times, 100 to 400 ms apart (infra shared/pkg/proxy/pool, its
#: `SandboxProxyRetries`): a server that starts listening within a second of the request —
#: just started, or in a sandbox that a request has just woken — answers, where one attempt
#: would have said "port is not open".
DIAL_BACKOFF_S = (0.1, 0.2, 0.3, 0.4)
#: A guest that takes longer than this to start answering is logged (slow, or stuck)
SLOW_ANSWER_S = 5.0
READ_CHUNK = 256 * 1024


@dataclass(frozen=True)
class Upstream:
    """Where to send a sandbox's request: its guest port, or a node proxy in front of it
    (`headers` then tell that proxy which sandbox and port: it resolves them itself), and
    who may: `traffic_digest` set means guest ports need the traffic token (`ingress`)."""

    host: str
    port: int
    headers: tuple[tuple[bytes, bytes], ...] = ()
    traffic_digest: str | None = None
    #: the target it names (`RouteTable.via`): a route that changes to the same target
    #: leaves the streams open to it alone (a pause and resume seen late, as one change)
    via: str = ""


class SandboxUnavailable(Exception):
    """The sandbox does not exist or is not running: E2B's 502 "was not found" answer."""


class TrafficRefused(Exception):
    """The request lacks the sandbox's traffic token (`ingress.refusal`'s message): 403."""


#: (sandbox id, port, the request's traffic token) → where it goes. The token is for a
#: resolver that would act before any route exists (an auto-resume must not be woken by
#: anyone): it raises `TrafficRefused`; a routed request is checked here, by the route.
Resolver = Callable[[str, int, str | None], Awaitable[Upstream]]


class SandboxProxy:
    """ASGI middleware: sandbox traffic to the guest, everything else to `app`."""

    def __init__(self, app: ASGIApp, resolve: Resolver, *, domain: str | None = None):
        self.app = app
        self.resolve = resolve
        self.domain = domain
        #: open upstream connections per sandbox and the target each goes to, so a kill or
        #: pause can end them at once (a guest gone with its network namespace never sends
        #: a FIN)
        self._open: dict[str, dict[asyncio.StreamWriter, str]] = {}

    def close_sandbox(self, sandbox_id: str, keep_via: str | None = None) -> int:
        """End the proxied streams of a sandbox that is gone (killed or paused), or whose
        route now names another target: those to `keep_via` (the new route's) stay open.
        Returns how many were cut."""
        streams = self._open.get(sandbox_id, {})
        cut = [w for w, via in streams.items() if keep_via is None or via != keep_via]
        for writer in cut:
            streams.pop(writer, None)
            writer.close()
        if not streams:
            self._open.pop(sandbox_id, None)
        return len(cut)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        target = sandbox_target(scope, self.domain) if kind in ("http", "websocket") else None
        if target is None:
            if kind in ("http", "websocket") and (host := stray_host(scope, self.domain)):
                hint = f"{{port}}-{{sandboxId}}.{self.domain} or {API_LABEL}.{self.domain}"
                msg = f"host {host} names no sandbox port: use {hint}"
                await _refuse(kind, send, 400, {"code": 400, "message": msg})
                return
            await self.app(scope, receive, send)
            return
        sid, port = target
        token = presented_token(scope)
        try:
            upstream = await self.resolve(sid, port, token)
        except SandboxUnavailable:
            await _refuse(
                kind,
                send,
                502,
                {"sandboxId": sid, "code": 502, "message": "The sandbox was not found"},
            )
            return
        except TrafficRefused as e:
            denied: str | None = str(e)
        else:
            denied = refusal(upstream.traffic_digest, port, token)
        if denied is not None:
            await _refuse(kind, send, 403, {"sandboxId": sid, "message": denied, "code": 403})
            return
        try:
            reader, writer = await _dial(upstream.host, upstream.port)
        except OSError as e:  # TimeoutError too
            up = f"{upstream.host}:{upstream.port}"
            log.info("sandbox %s: port %s not open (%s: %s)", sid, port, up, e)
            msg = f"The sandbox is running but port is not open ({port})"
            await _refuse(kind, send, 502, {"sandboxId": sid, "code": 502, "message": msg})
            return
        self._open.setdefault(sid, {})[writer] = upstream.via
        try:
            if kind == "websocket":
                host = f"{upstream.host}:{upstream.port}"
                await forward_websocket(
                    scope, receive, send, reader, writer, host, upstream.headers
                )
            else:
                await _forward(scope, receive, send, reader, writer, upstream, sid)
        finally:
            self._open.get(sid, {}).pop(writer, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _dial(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to `host:port`, tried again after each of `DIAL_BACKOFF_S` while it is
    refused (or unreachable); a connection that hangs fails at once, after `CONNECT_TIMEOUT`."""
    for pause in (*DIAL_BACKOFF_S, None):
        try:
            return await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT)
        except TimeoutError:
            raise
        except OSError:
            if pause is None:
                raise
            await asyncio.sleep(pause)
    raise AssertionError("unreachable")


async def _forward(
    scope: Scope,
    receive: Receive,
    send: Send,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    upstream: Upstream,
    sandbox_id: str,
) -> None:
    conn = h11.Connection(h11.CLIENT)
    writer.write(conn.send(_request_head(scope, upstream)))
    pump = asyncio.create_task(_pump_request(receive, writer, conn))
    answer = _Answer(scope, send, upstream, sandbox_id)
    try:
        await answer.relay(conn, reader, pump)
    except (h11.RemoteProtocolError, h11.LocalProtocolError, OSError) as e:
        if pump.done():
            return
        if not answer.started:
            log.warning("proxy to %s:%s failed: %s", upstream.host, upstream.port, e)
            await _json(send, 502, {"code": 502, "message": f"sandbox connection failed: {e}"})
            return
        # The guest's answer broke off (its sandbox was killed or paused, and
        # `close_sandbox` cut it): the client's must break off too, not end cleanly — a
        # clean end of a command's stream read as "Command ended without an end event",
        # where E2B's SDK, seeing the connection drop, asks the sandbox's health and says
        # it was killed (`SandboxNotRunningException`).
        raise StreamCut(f"the stream of sandbox {sandbox_id} was cut: {e}") from e
    finally:
        if not pump.done():
            pump.cancel()
        with contextlib.suppress(BaseException):
            await pump


def _request_head(scope: Scope, upstream: Upstream) -> h11.Request:
    """The client's request as the guest gets it: hop-by-hop headers (and any the upstream
    sets itself) replaced, a body of unknown length chunked."""
    ours = {k for k, _ in upstream.headers}
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP | ours]
    headers += upstream.headers
    has_length = any(k == b"content-length" for k, _ in headers)
    if not has_length and scope["method"] not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        headers.append((b"transfer-encoding", b"chunked"))
    headers.insert(0, (b"host", f"{upstream.host}:{upstream.port}".encode()))
    target = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    return h11.Request(method=scope["method"], target=target, headers=headers)


async def _pump_request(
    receive: Receive, writer: asyncio.StreamWriter, conn: h11.Connection
) -> None:
    """Request body upstream as it arrives; then watch for the client going away."""
    body_done = False
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            writer.close()  # ends the upstream stream: envd sees the drop, as direct
            return
        if body_done:
            continue
        body = msg.get("body", b"")
        if body:
            writer.write(conn.send(h11.Data(data=body)))
            await writer.drain()
        if not msg.get("more_body", False):
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
            body_done = True


class _Answer:
    """The guest's answer relayed to the client as it arrives; whether it has started
    decides how a broken connection is told (a 502, or a cut stream)."""

    def __init__(self, scope: Scope, send: Send, upstream: Upstream, sandbox_id: str) -> None:
        self.scope = scope
        self.send = send
        self.upstream = upstream
        self.sandbox_id = sandbox_id
        self.started = False
        self._loop = asyncio.get_running_loop()
        self._sent = self._loop.time()

    def waited(self, what: str) -> None:
        if (took := self._loop.time() - self._sent) > SLOW_ANSWER_S:
            scope, up = self.scope, self.upstream
            where = f"{scope['method']} {scope['path']} to sandbox {self.sandbox_id}"
            log.warning("%s (%s:%s): %s after %.1f s", where, up.host, up.port, what, took)

    async def relay(
        self, conn: h11.Connection, reader: asyncio.StreamReader, pump: asyncio.Task[None]
    ) -> None:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(READ_CHUNK)
                if not data and pump.done():
                    if not self.started:
                        self.waited("the client left without an answer")
                    return  # the client left and we closed upstream
                conn.receive_data(data)
                continue
            if isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                break
            await self._relay_event(event)
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _relay_event(self, event: object) -> None:
        if isinstance(event, h11.Response):
            self.waited(f"answered {event.status_code}")
            await self.send(
                {
                    "type": "http.response.start",
                    "status": event.status_code,
                    "headers": [(k, v) for k, v in event.headers if k not in HOP_BY_HOP],
                }
            )
            self.started = True
        elif isinstance(event, h11.Data):
            await self.send(
                {"type": "http.response.body", "body": bytes(event.data), "more_body": True}
            )
        # an InformationalResponse (100 Continue) is the guest's and the proxy's business


class StreamCut(Exception):
    """Raised to the ASGI server to drop the client's connection mid-answer (there is no
    ASGI message for that): the guest's side broke off."""


class _QuietCuts(logging.Filter):
    """The ASGI server logs an application error for the drop `StreamCut` asks for: it
    is the sandbox going, not a fault of ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, StreamCut)


logging.getLogger("uvicorn.error").addFilter(_QuietCuts())


async def _refuse(kind: str, send: Send, status: int, body: dict[str, Any]) -> None:
    """An HTTP error body, or for a WebSocket a close before accepting (the ASGI server
    answers the upgrade with 403 then; the reason carries our message)."""
    if kind == "websocket":
        await send({"type": "websocket.close", "code": 1011, "reason": body["message"][:120]})
    else:
        await _json(send, status, body)


async def _json(send: Send, status: int, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json; charset=utf-8"),
                (b"content-length", str(len(raw)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": raw, "more_body": False})
