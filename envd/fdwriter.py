"""Buffered, non-blocking writes to a process's stdin pipe or pty master."""

from __future__ import annotations

import asyncio
import contextlib
import os


class FdWriter:
    """Buffered, non-blocking writes to a pipe or pty master, closable after a flush."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, owns_fd: bool) -> None:
        self._loop = loop
        self.fd = fd
        self._owns = owns_fd
        self._buf = bytearray()
        self._close_pending = False
        self.closed = False

    def write(self, data: bytes) -> None:
        if self.closed or self._close_pending:
            raise BrokenPipeError("stdin not enabled or closed")
        if not self._buf:
            try:
                n = os.write(self.fd, data)
            except BlockingIOError:
                n = 0
            data = data[n:]
            if not data:
                return
            self._loop.add_writer(self.fd, self._on_writable)
        self._buf += data

    def _on_writable(self) -> None:
        try:
            n = os.write(self.fd, self._buf)
        except BlockingIOError:
            return
        except OSError:
            self._buf.clear()
            n = 0
        del self._buf[:n]
        if not self._buf:
            self._loop.remove_writer(self.fd)
            if self._close_pending:
                self._really_close()

    def close(self) -> None:
        if self.closed:
            return
        if self._buf:
            self._close_pending = True
        else:
            self._really_close()

    def _really_close(self) -> None:
        self.closed = True
        self._loop.remove_writer(self.fd)
        if self._owns:
            with contextlib.suppress(OSError):
                os.close(self.fd)

    def abandon(self) -> None:
        """Drop pending input (the process is gone) without closing a shared fd."""
        self._buf.clear()
        self._loop.remove_writer(self.fd)
        if self._owns and not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                os.close(self.fd)
        self.closed = True
