"""A login shell on a PTY in a guest, through envd's Connect process API (JSON codec): what
the SDK's `sandbox.pty` does (`aenv/commands/terminal.py` drives it), spoken from the API so
the browser's terminal needs nothing but its WebSocket to us.

`process.Process/Start` with a `pty` opens a server stream (Connect envelopes: a 5-byte
prefix, flag 0x02 on the last); the first event names the pid, then `data.pty` chunks
(base64) until `end`. Keystrokes and resizes are unary calls on that pid (`SendInput`,
`Update`). The guest is reached the way the sandbox proxy reaches it: the route table's
`Upstream` — the guest's address, or its node's proxy with the sandbox named in headers.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import AsyncIterator
from typing import Any

import httpx

from shared.proxy import Upstream

__all__ = ["ENVD_PORT", "GuestPty", "PtyError"]

ENVD_PORT = 49983
_END_STREAM = 0x02
#: envd sends a keepalive this often on an idle stream (seconds): a dead guest shows up as
#: a stream that stops; the bridge also asks the log whether the sandbox still runs.
KEEPALIVE_S = 15
#: what the SDK's `pty.create` sets, so programs in the browser's terminal see the same
_ENVS = {"TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


class PtyError(Exception):
    """envd refused or broke the PTY (its Connect error's message)."""


def _envelope(msg: dict[str, Any]) -> bytes:
    data = json.dumps(msg).encode()
    return struct.pack(">BI", 0, len(data)) + data


class _Frames:
    """Connect envelopes out of a byte stream chunked anyhow."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, chunk: bytes) -> list[tuple[int, bytes]]:
        self.buf += chunk
        out: list[tuple[int, bytes]] = []
        while len(self.buf) >= 5:
            flags, length = struct.unpack_from(">BI", self.buf, 0)
            if len(self.buf) < 5 + length:
                break
            out.append((flags, bytes(self.buf[5 : 5 + length])))
            del self.buf[: 5 + length]
        return out


class GuestPty:
    """One shell: `open()` it, iterate `output()` (bytes, then the exit code as an int),
    `send()` keystrokes, `resize()`, `close()`."""

    def __init__(self, upstream: Upstream, token: str | None) -> None:
        self.base = f"http://{upstream.host}:{upstream.port}"
        self.headers = {k.decode(): v.decode() for k, v in upstream.headers}
        if token:
            self.headers["X-Access-Token"] = token
        # no read timeout: a shell may print nothing for an hour (keepalives come meanwhile)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None))
        self.pid: int | None = None
        self._stream: AsyncIterator[dict[str, Any]] | None = None
        self._response: httpx.Response | None = None

    async def open(self, cols: int, rows: int) -> int:
        """Start `bash -i -l` on a PTY of that size; returns its pid."""
        body = {
            "process": {"cmd": "/bin/bash", "args": ["-i", "-l"], "envs": _ENVS},
            "pty": {"size": {"cols": cols, "rows": rows}},
        }
        request = self.client.build_request(
            "POST",
            f"{self.base}/process.Process/Start",
            content=_envelope(body),
            headers={
                **self.headers,
                "Content-Type": "application/connect+json",
                "Connect-Protocol-Version": "1",
                "Keepalive-Ping-Interval": str(KEEPALIVE_S),
            },
        )
        try:
            self._response = await self.client.send(request, stream=True)
        except httpx.HTTPError as e:
            raise PtyError(f"envd did not answer: {e}") from e
        if self._response.status_code != 200:
            text = (await self._response.aread()).decode(errors="replace")[:300]
            raise PtyError(f"envd answered {self._response.status_code}: {text}")
        self._stream = stream = self._events()
        async for event in stream:
            if "start" in event:
                self.pid = int(event["start"]["pid"])
                return self.pid
        raise PtyError("envd ended the stream before the shell started")

    async def _events(self) -> AsyncIterator[dict[str, Any]]:
        assert self._response is not None
        frames = _Frames()
        async for chunk in self._chunks():
            for flags, payload in frames.feed(chunk):
                msg = json.loads(payload or b"{}")
                if flags & _END_STREAM:
                    if "error" in msg:
                        raise PtyError(str(msg["error"].get("message") or msg["error"]))
                    return
                event = msg.get("event") or {}
                if "keepalive" not in event:
                    yield event

    async def _chunks(self) -> AsyncIterator[bytes]:
        assert self._response is not None
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.HTTPError as e:  # the guest went away mid-stream (killed, paused)
            raise PtyError(f"the shell's stream broke off ({type(e).__name__})") from e

    async def output(self) -> AsyncIterator[bytes | int]:
        """What the shell prints, then its exit code once it ends (-1: killed)."""
        assert self._stream is not None, "open() first"
        async for event in self._stream:
            if "data" in event and "pty" in event["data"]:
                yield base64.b64decode(event["data"]["pty"])
            elif "end" in event:
                yield int(event["end"].get("exitCode", 0))
                return

    async def _call(self, method: str, msg: dict[str, Any]) -> None:
        try:
            r = await self.client.post(
                f"{self.base}/process.Process/{method}",
                content=json.dumps(msg).encode(),
                headers={
                    **self.headers,
                    "Content-Type": "application/json",
                    "Connect-Protocol-Version": "1",
                },
            )
        except httpx.HTTPError as e:
            raise PtyError(f"envd did not answer {method}: {e}") from e
        if r.status_code != 200:
            raise PtyError(f"envd refused {method}: {r.text[:300]}")

    async def send(self, data: bytes) -> None:
        pty = base64.b64encode(data).decode()
        await self._call("SendInput", {"process": {"pid": self.pid}, "input": {"pty": pty}})

    async def resize(self, cols: int, rows: int) -> None:
        await self._call(
            "Update", {"process": {"pid": self.pid}, "pty": {"size": {"cols": cols, "rows": rows}}}
        )

    async def close(self) -> None:
        """End the shell (a browser tab closed must not leave bash running) and the stream."""
        try:
            if self.pid is not None:
                await self._call(
                    "SendSignal", {"process": {"pid": self.pid}, "signal": "SIGNAL_SIGKILL"}
                )
        except PtyError:
            pass  # already ended, or the guest is gone: nothing left to stop
        finally:
            if self._response is not None:
                await self._response.aclose()
            await self.client.aclose()
