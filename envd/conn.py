"""One TCP connection as an asyncio BufferedProtocol, with a small stream-like API.

Why not asyncio's StreamReader: it copies every received byte twice in user space (into its
buffer, then out into a new bytes object), which made envd as CPU-hungry as the SDK client
on uploads. Here the kernel writes straight into one fixed buffer (`recv_into`) and an upload
goes from that buffer to the file with no copy at all (`read_view`). It also lets a stream
wait for "the client sent something or hung up" without consuming a byte (`wait_readable`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

SMALL = 64 * 1024  # every connection starts here, and returns here when idle
CAPACITY = 2 * 1024 * 1024  # grown up to this while a big body streams in
HIGH_WATER = 1024 * 1024  # stop reading the socket above this many unconsumed bytes
MIN_FREE = 16 * 1024  # compact or grow the buffer when less than this is free at its end


class Connection(asyncio.BufferedProtocol):
    """Reader and writer of one connection; `serve(conn)` runs as its task."""

    def __init__(self, serve: Callable[[Connection], Coroutine[Any, Any, None]]) -> None:
        self._serve = serve
        self._buf = bytearray(SMALL)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._eof = False
        self._lost = False
        self._waiter: asyncio.Future[None] | None = None
        self._paused_reading = False
        self._paused_writing = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def from_loopback(self) -> bool:
        """Whether the peer is this guest itself (a process in it dialling 127.0.0.1):
        the control plane and clients come from outside, through the slot's address."""
        peer: tuple[str, int] | None = (
            self.transport.get_extra_info("peername") if self.transport else None
        )
        return peer is not None and str(peer[0]) in ("127.0.0.1", "::1")

    # --- protocol callbacks -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.task = asyncio.get_running_loop().create_task(self._serve(self))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._start == self._end:
            self._start = self._end = 0
        size = len(self._buf)
        if size - self._end < MIN_FREE:
            n = self._end - self._start
            if self._start and n < size // 2:  # mostly consumed: compact in place
                self._buf[0:n] = self._buf[self._start : self._end]
            else:  # mostly unconsumed: a big body is streaming in, grow (64K..2M)
                # A new buffer, not a resize: a consumer may still hold a view of the old.
                bigger = bytearray(min(CAPACITY, size * 4))
                bigger[0:n] = self._buf[self._start : self._end]
                self._buf = bigger
                self._view = memoryview(bigger)
            self._start, self._end = 0, n
        return self._view[self._end :]

    def reserve(self, size: int) -> None:
        """Make the buffer at least `size` (≤ CAPACITY) for a big body: recv() can then take
        as much as the socket has per wake-up instead of 64 KiB, which halves the loop
        iterations — and the sender's stalls — per megabyte."""
        size = min(size, CAPACITY)
        if len(self._buf) < size:
            n = self._end - self._start
            bigger = bytearray(size)
            bigger[0:n] = self._buf[self._start : self._end]
            self._buf = bigger
            self._view = memoryview(bigger)
            self._start, self._end = 0, n

    def shrink_if_idle(self) -> None:
        """Back to a small buffer between requests: idle keep-alive connections stay cheap."""
        if self._start == self._end and len(self._buf) > SMALL:
            self._buf = bytearray(SMALL)
            self._view = memoryview(self._buf)
            self._start = self._end = 0

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        if self._end - self._start >= HIGH_WATER and not self._paused_reading:
            self._paused_reading = True
            assert self.transport is not None
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # close the transport once we are done writing

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._lost = True
        self._wake()
        w = self._drain_waiter
        if w is not None and not w.done():
            w.set_exception(ConnectionResetError("connection lost"))

    def pause_writing(self) -> None:
        self._paused_writing = True

    def resume_writing(self) -> None:
        self._paused_writing = False
        w = self._drain_waiter
        if w is not None and not w.done():
            w.set_result(None)

    # --- reading ------------------------------------------------------------------------

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        if self._waiter is not None:
            raise RuntimeError("concurrent reads on one connection")
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _consumed(self, n: int) -> None:
        self._start += n
        if self._paused_reading and self._end - self._start < HIGH_WATER // 2:
            self._paused_reading = False
            if self.transport is not None and not self._lost:
                self.transport.resume_reading()

    @property
    def buffered(self) -> int:
        return self._end - self._start

    def at_eof(self) -> bool:
        return self._eof and self._start == self._end

    async def wait_readable(self) -> None:
        """Return once there is data to read or the peer closed; consumes nothing."""
        while self._start == self._end and not self._eof:
            await self._wait()

    async def readuntil(self, sep: bytes, limit: int) -> bytes:
        """Bytes up to and including `sep`; IncompleteReadError at EOF, LimitOverrunError
        if `limit` bytes arrive without it."""
        scanned = 0  # bytes after _start already searched (relative: the buffer may compact)
        while True:
            idx = self._buf.find(sep, self._start + max(0, scanned - len(sep) + 1), self._end)
            if idx >= 0:
                end = idx + len(sep)
                data = bytes(self._view[self._start : end])
                self._consumed(end - self._start)
                return data
            if self._end - self._start > limit:
                raise asyncio.LimitOverrunError("separator not found within the limit", 0)
            if self._eof:
                partial = bytes(self._view[self._start : self._end])
                self._consumed(len(partial))
                raise asyncio.IncompleteReadError(partial, None)
            scanned = self._end - self._start
            await self._wait()

    async def read(self, n: int) -> bytes:
        """Up to n bytes as soon as any are there; b"" at EOF."""
        view = await self.read_view(n)
        data = bytes(view)
        view.release()
        return data

    async def read_view(self, n: int) -> memoryview:
        """Like read(), but a view into the receive buffer: use it (and drop it) before the
        next read on this connection. Empty at EOF."""
        _, start, end = await self.read_span(n)
        return self._view[start:end]

    async def read_span(self, n: int) -> tuple[bytearray, int, int]:
        """Like read_view(), as (buffer, start, end): the bytes are buffer[start:end]. For
        parsers that search what arrived in place (`bytearray.find(sep, start, end)`; a
        memoryview has no find). Valid until the next read; start == end at EOF."""
        while self._start == self._end:
            if self._eof:
                return self._buf, 0, 0
            await self._wait()
        start = self._start
        k = min(n, self._end - start)
        self._consumed(k)
        return self._buf, start, start + k

    async def readexactly(self, n: int) -> bytes:
        parts: list[bytes] = []
        while n:
            data = await self.read(n)
            if not data:
                raise asyncio.IncompleteReadError(b"".join(parts), None)
            parts.append(data)
            n -= len(data)
        return b"".join(parts)

    # --- writing ------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self._lost:
            self.transport.write(data)

    async def drain(self) -> None:
        if self._lost:
            raise ConnectionResetError("connection lost")
        if self._paused_writing:
            self._drain_waiter = asyncio.get_running_loop().create_future()
            try:
                await self._drain_waiter
            finally:
                self._drain_waiter = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
