"""One NBD client's connection to the block service: the handshake, then its requests.

A protocol object rather than a stream reader and a task per request, because a warm read
at queue depth 1 is what a guest's random reads wait on, and every hop of the loop is paid
per read: requests are parsed where their bytes arrive (`data_received`), a read the cache
can answer at once (`Export.read_now`: cached, in the page cache) is answered right there,
header and data in one `writelines`, and only a read that must wait (a fetch, the disk)
becomes a task. Replies are written whole, so they stay framed in whatever order reads
finish (NBD matches them by handle).

Slow reads in flight per connection are bounded (`MAX_INFLIGHT`): at the bound, and while
the client does not take its replies (the transport's write buffer is full), the connection
stops reading requests, which bounds what a client can make us hold (`MAX_INFLIGHT` times
32 MiB at worst, plus one socket buffer of replies).

The handshake awaits the repository (an export's manifest), so it runs as one task that
reads its exact option bytes from the same buffer (`_recv`). An option naming an unknown
export is refused (NBD_REP_ERR_UNKNOWN for GO/INFO; a hang-up for EXPORT_NAME, which has no
error reply).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

from workers.snapshot.blocks import protocol as nbd
from workers.snapshot.blocks.export import Export, Exports
from workers.snapshot.blocks.stats import BlockStats

__all__ = ["MAX_INFLIGHT", "Connection"]

log = logging.getLogger(__name__)

#: Reads one connection may have waiting (fetch or disk); QEMU keeps at most 16 in flight.
MAX_INFLIGHT = 16

_HEADER = nbd.REQUEST_HEADER
_READ = nbd.READ
_DISC = int(nbd.Cmd.DISC)
_WRITE = int(nbd.Cmd.WRITE)


class Connection(asyncio.Protocol):
    """Serves one client; `gone(self)` is called once it is closed."""

    def __init__(self, exports: Exports, stats: BlockStats, gone: Callable[[Connection], None]):
        self.exports = exports
        self.stats = stats
        self._gone = gone
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._want = 0
        self._waiter: asyncio.Future[None] | None = None
        self._handshake: asyncio.Task[None] | None = None
        self._export: Export | None = None
        self._reads: set[asyncio.Task[None]] = set()
        self._full = False  # MAX_INFLIGHT reads waiting: requests stay in the buffer
        self._write_paused = False  # the client is not taking its replies
        self._ending = False  # DISC or a framing error: no more requests
        self._lost = False

    # -- transport callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike
        self.transport = transport = cast(asyncio.Transport, transport)
        self.stats.connections += 1
        transport.write(nbd.greeting())
        self._handshake = asyncio.get_running_loop().create_task(self._negotiate())

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.stats.connections -= 1
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionResetError("the client went away"))
        if self._handshake is not None:
            self._handshake.cancel()
        for task in self._reads:
            task.cancel()
        self._gone(self)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._export is not None:
            self._serve()
        elif self._waiter is not None and len(self._buf) >= self._want and not self._waiter.done():
            self._waiter.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._pause()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._resume()
        if self._export is not None and not self._lost:
            self._serve()  # the requests that waited in the buffer meanwhile

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- handshake -------------------------------------------------------------------

    async def _recv(self, n: int) -> bytes:
        while len(self._buf) < n:
            if self._lost:
                raise ConnectionResetError("the client went away")
            self._want = n
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def _negotiate(self) -> None:
        transport = self.transport
        assert transport is not None
        try:
            flags = nbd.client_flags(await self._recv(4))
            export = await self._options(transport, bool(flags & nbd.FLAG_NO_ZEROES))
        except ConnectionError:
            return  # the client went away: nothing to answer
        except nbd.ProtocolError as e:
            log.warning("blocks: dropping a client: %s", e)
            transport.close()
            return
        if export is None:
            transport.close()
            return
        self._export = export
        self._serve()  # requests sent right behind the GO

    async def _options(self, transport: asyncio.Transport, no_zeroes: bool) -> Export | None:
        """Answer options until the client picks an export (returned) or leaves (None)."""
        while True:
            opt, length = nbd.option_header(await self._recv(nbd.OPTION_HEADER))
            data = await self._recv(length) if length else b""
            sizes: dict[str, int] = {}
            name = nbd.export_name_of(opt, data)
            if name is not None:
                try:
                    found = await self.exports.open(name)
                except Exception as e:  # the repository is down: the open fails, we stay
                    log.warning("blocks: cannot look up export %s: %s", name, e)
                    found = None
                if found is not None:
                    sizes[name] = found.size
                else:
                    log.info("blocks: unknown export %r refused", name)
            answer = nbd.answer_option(
                opt, data, sizes.get, no_zeroes=no_zeroes, listed=self.exports.names()
            )
            transport.write(answer.replies)
            if answer.outcome is nbd.Outcome.SERVE and answer.export is not None:
                return self.exports.known(answer.export)
            if answer.outcome is nbd.Outcome.CLOSE:
                return None

    # -- transmission ----------------------------------------------------------------

    def _serve(self) -> None:
        """Answer the whole requests in the buffer, the warm reads on the spot."""
        export, transport, buf = self._export, self.transport, self._buf
        assert export is not None and transport is not None
        stats, size, read_now = self.stats, export.size, export.read_now
        reply = nbd.simple_reply
        pos, end = 0, len(buf)
        try:
            while end - pos >= _HEADER and not (self._full or self._write_paused or self._ending):
                _, cmd, handle, offset, length = nbd.unpack_request(buf, pos)
                if cmd == _READ and length <= nbd.MAX_REQUEST and offset + length <= size:
                    pos += _HEADER
                    try:
                        data = read_now(offset, length)
                    except OSError:  # the slow path tries again, and answers EIO if it fails
                        data = None
                    if data is None:
                        self._read_later(handle, offset, length)
                    else:
                        stats.read(export.stats, length)
                        transport.writelines((reply(handle), data))
                    continue
                if cmd == _WRITE:  # its payload follows: skip it to stay framed
                    if length > nbd.MAX_REQUEST:
                        raise nbd.ProtocolError(f"write of {length} bytes")
                    if end - pos < _HEADER + length:
                        break  # the rest of its payload is still on its way
                    pos += length
                pos += _HEADER
                if cmd == _DISC:  # answer what was asked before it, then close
                    self._ending = True
                    if not self._reads:
                        transport.close()
                    break
                transport.write(reply(handle, nbd.request_error_of(cmd, offset, length, size)))
        except nbd.ProtocolError as e:
            log.warning("blocks: dropping a client: %s", e)
            self._ending = True
            transport.close()
        finally:
            del buf[:pos]

    def _read_later(self, handle: int, offset: int, length: int) -> None:
        task = asyncio.get_running_loop().create_task(self._read(handle, offset, length))
        self._reads.add(task)
        task.add_done_callback(self._read_done)
        if len(self._reads) >= MAX_INFLIGHT:
            self._full = True
            self._pause()

    def _read_done(self, task: asyncio.Task[None]) -> None:
        self._reads.discard(task)
        if self._lost:
            return
        if self._ending:
            if not self._reads and self.transport is not None:
                self.transport.close()
            return
        if self._full and len(self._reads) < MAX_INFLIGHT:
            self._full = False
            self._resume()
            self._serve()  # what waited in the buffer meanwhile

    async def _read(self, handle: int, offset: int, length: int) -> None:
        export, transport = self._export, self.transport
        assert export is not None and transport is not None
        try:
            data = await export.read(offset, length)
        except Exception as e:  # a chunk the repository cannot give: this read fails, not us
            self.stats.read_errors += 1
            log.warning("blocks: read of %s at %d+%d failed: %r", export.digest, offset, length, e)
            if not transport.is_closing():
                transport.write(nbd.simple_reply(handle, nbd.EIO))
            return
        self.stats.read(export.stats, length)
        if not transport.is_closing():
            transport.writelines((nbd.simple_reply(handle), data))

    def _pause(self) -> None:
        if self.transport is not None and not self._lost:
            self.transport.pause_reading()

    def _resume(self) -> None:
        paused = self._full or self._write_paused
        if self.transport is not None and not self._lost and not paused:
            self.transport.resume_reading()
