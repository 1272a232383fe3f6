"""WebSocket traffic to a guest port: the proxy's other half (HTTP lives in `shared.proxy.stream`).

The ASGI server has already done the client-side handshake's parsing; we open the same
upgrade to the guest, accept the client only once the guest accepted (with the guest's
subprotocol), then relay messages both ways until either side closes. A guest that
refuses the upgrade is reported to the client as a close with code 1011 + its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

log = logging.getLogger(__name__)

READ_CHUNK = 64 * 1024
#: Request headers of the client handshake not to repeat upstream (wsproto writes its own).
_OWN = frozenset(
    {
        b"host",
        b"upgrade",
        b"connection",
        b"sec-websocket-key",
        b"sec-websocket-version",
        b"sec-websocket-protocol",
        b"sec-websocket-extensions",
        b"e2b-sandbox-id",
        b"e2b-sandbox-port",
    }
)

Send = Any
Receive = Any


async def forward_websocket(
    scope: dict[str, Any],
    receive: Receive,
    send: Send,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    host: str,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    ws = WSConnection(ConnectionType.CLIENT)
    target = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    if scope.get("query_string"):
        target += "?" + scope["query_string"].decode("latin-1")
    headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() not in _OWN]
    headers += extra  # a node proxy's routing headers
    writer.write(
        ws.send(
            Request(
                host=host,
                target=target,
                extra_headers=headers,
                subprotocols=list(scope.get("subprotocols", ())),
            )
        )
    )
    await writer.drain()
    first = await receive()  # websocket.connect
    if first["type"] != "websocket.connect":
        return
    accepted = await _handshake(ws, reader)
    if not isinstance(accepted, AcceptConnection):
        await send(
            {
                "type": "websocket.close",
                "code": 1011,
                "reason": f"sandbox refused the upgrade ({accepted})",
            }
        )
        return
    await send({"type": "websocket.accept", "subprotocol": accepted.subprotocol})
    upstream = asyncio.create_task(_from_guest(ws, reader, writer, send))
    try:
        await _to_guest(ws, receive, writer, upstream)
    finally:
        upstream.cancel()
        with contextlib.suppress(BaseException):
            await upstream


async def _handshake(ws: WSConnection, reader: asyncio.StreamReader) -> AcceptConnection | str:
    while True:
        data = await reader.read(READ_CHUNK)
        if not data:
            return "connection closed"
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, AcceptConnection):
                return event
            if isinstance(event, RejectConnection):
                return f"HTTP {event.status_code}"
            if isinstance(event, RejectData):
                continue


async def _to_guest(
    ws: WSConnection, receive: Receive, writer: asyncio.StreamWriter, upstream: asyncio.Task[None]
) -> None:
    """Client messages to the guest until the client leaves (or the guest side ended)."""
    recv: asyncio.Task[dict[str, Any]] | None = None
    try:
        while True:
            recv = asyncio.create_task(receive())
            done, _ = await asyncio.wait({recv, upstream}, return_when=asyncio.FIRST_COMPLETED)
            if recv not in done:
                return  # the guest closed: `_from_guest` already told the client
            msg = recv.result()
            if msg["type"] == "websocket.disconnect":
                with contextlib.suppress(LocalProtocolError, OSError):
                    writer.write(ws.send(CloseConnection(code=msg.get("code", 1000))))
                    await writer.drain()
                return
            if msg.get("bytes") is not None:
                writer.write(ws.send(BytesMessage(data=msg["bytes"])))
            elif msg.get("text") is not None:
                writer.write(ws.send(TextMessage(data=msg["text"])))
            await writer.drain()
    except (LocalProtocolError, OSError) as e:
        log.info("websocket to guest ended: %s", e)
    finally:
        if recv is not None and not recv.done():
            recv.cancel()


async def _from_guest(
    ws: WSConnection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, send: Send
) -> None:
    """Guest messages to the client; a guest close (or vanishing) closes the client."""
    parts: list[Any] = []
    code = 1000
    try:
        while True:
            data = await reader.read(READ_CHUNK)
            if not data:
                code = 1006
                break
            ws.receive_data(data)
            closed = False
            for event in ws.events():
                if isinstance(event, Message):
                    parts.append(event.data)
                    if event.message_finished:
                        if isinstance(event, TextMessage):
                            await send({"type": "websocket.send", "text": "".join(parts)})
                        else:
                            await send({"type": "websocket.send", "bytes": b"".join(parts)})
                        parts = []
                elif isinstance(event, Ping):
                    writer.write(ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    code = event.code
                    with contextlib.suppress(LocalProtocolError):
                        writer.write(ws.send(event.response()))
                    closed = True
            await writer.drain()
            if closed:
                break
    except (RemoteProtocolError, LocalProtocolError, OSError) as e:
        log.info("websocket from guest ended: %s", e)
        code = 1011
    with contextlib.suppress(Exception):
        await send({"type": "websocket.close", "code": code if code != 1006 else 1011})
