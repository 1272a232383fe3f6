"""WebSocket upgrades through the sandbox proxy to a server running inside the guest.

The guest has no WebSocket library, so the server is a small stdlib one (handshake + frame
codec): it answers each message with "echo:" + the message and closes when asked.
"""

from __future__ import annotations

import socket
import textwrap
from urllib.parse import urlparse

import pytest
from e2b import Sandbox
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    RejectConnection,
    Request,
    TextMessage,
)

from tests.e2e.conftest import Stack

pytestmark = pytest.mark.vm

PORT = 8765
ECHO_SERVER = textwrap.dedent(r"""
    import base64, hashlib, socket, struct
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", PORT))
    s.listen()
    while True:
        c, _ = s.accept()
        req = b""
        while b"\r\n\r\n" not in req:
            req += c.recv(4096)
        lines = req.split(b"\r\n")
        key = [l.split(b":", 1)[1].strip() for l in lines
               if l.lower().startswith(b"sec-websocket-key")][0]
        proto = [l.split(b":", 1)[1].strip().split(b",")[0] for l in lines
                 if l.lower().startswith(b"sec-websocket-protocol")]
        acc = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                  b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n"
                  + (b"Sec-WebSocket-Protocol: " + proto[0] + b"\r\n" if proto else b"")
                  + b"\r\n")
        f = c.makefile("rb")
        while True:
            h = f.read(2)
            if len(h) < 2:
                break
            op, n = h[0] & 15, h[1] & 127
            if n == 126:
                n = struct.unpack(">H", f.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", f.read(8))[0]
            mask = f.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(f.read(n)))
            if op == 8:
                c.sendall(b"\x88\x02\x03\xe8")
                break
            reply = b"echo:" + data
            n = len(reply)
            size = bytes([n]) if n < 126 else b"\x7e" + struct.pack(">H", n)
            c.sendall(bytes([0x80 | op]) + size + reply)
        c.close()
""").replace("PORT", str(PORT))


class Client:
    """A blocking WebSocket client over one socket (wsproto does the framing)."""

    def __init__(self, api_url: str, sandbox_id: str, port: int, protocols: list[str]) -> None:
        url = urlparse(api_url)
        self.sock = socket.create_connection((url.hostname, url.port), timeout=20)
        self.ws = WSConnection(ConnectionType.CLIENT)
        headers = [
            (b"E2b-Sandbox-Id", sandbox_id.encode()),
            (b"E2b-Sandbox-Port", str(port).encode()),
        ]
        hello = Request(
            host=url.netloc, target="/chat", extra_headers=headers, subprotocols=protocols
        )
        self.sock.sendall(self.ws.send(hello))

    def next_event(self) -> Event:
        while True:
            for event in self.ws.events():
                return event
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.ws.receive_data(data)

    def send(self, event: Event) -> None:
        self.sock.sendall(self.ws.send(event))


def test_websocket_through_the_proxy_to_a_guest_server(stack: Stack) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.files.write("/tmp/ws.py", ECHO_SERVER)
        sbx.commands.run("python3 /tmp/ws.py", background=True)
        sbx.commands.run(
            f"for i in $(seq 100); do ss -ltn | grep -q :{PORT} && break; sleep 0.1; done"
        )
        c = Client(stack.api_url, sbx.sandbox_id, PORT, ["chat.v1"])
        accepted = c.next_event()
        assert isinstance(accepted, AcceptConnection), accepted
        assert accepted.subprotocol == "chat.v1"
        c.send(TextMessage(data="hello"))
        reply = c.next_event()
        assert isinstance(reply, TextMessage) and reply.data == "echo:hello"
        big = bytes(range(256)) * 200  # 51 KiB: several reads on both hops
        c.send(BytesMessage(data=big))
        got = b""
        while len(got) < len(big) + 5:
            ev = c.next_event()
            assert isinstance(ev, BytesMessage)
            got += ev.data
        assert got == b"echo:" + big
        c.send(CloseConnection(code=1000))
        assert isinstance(c.next_event(), CloseConnection)
    finally:
        sbx.kill()


def test_websocket_to_a_closed_port_or_unknown_sandbox_is_refused(stack: Stack) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        for sid, port in ((sbx.sandbox_id, 9), ("nosuchsandbox0000000", PORT)):
            c = Client(stack.api_url, sid, port, [])
            ev = c.next_event()
            assert isinstance(ev, RejectConnection), ev
            assert ev.status_code == 403  # ASGI: a close before accept refuses the upgrade
    finally:
        sbx.kill()
