"""The stack's log file (`<data dir>/aenv.log`): every line JSON, rotated by size.

The supervisor's own stdout and stderr — file descriptors 1 and 2, so a C library's write,
a child that inherited them and a traceback of the interpreter all land here — become a
pipe that one thread reads: a line that is a JSON record (the supervisor's and the roles'
logging, see `aenv.logs`) is written as it is, anything else is wrapped into a record of
service `aenv` first. The thread writes through the standard library's rotating file
handler: past `max_bytes` the file becomes `aenv.log.1` (`.2`, … up to `backups`), so a
stack that runs for months does not fill its disk with its own log.

A thread, not the event loop: the log must keep flowing while the loop is busy or stuck
(the lines that say why are the ones that matter then).
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import sys
import threading
from pathlib import Path

from aenv.logformat import wrap

__all__ = ["StackLog"]

#: A longer line is cut into pieces of this size (a child printing megabytes without a
#: newline must not grow the reader without bound).
MAX_LINE = 64 * 1024


class _PrivateFile(logging.handlers.RotatingFileHandler):
    """Each file it opens (the first, and each one a rotation starts) is 0600: the stack's
    log may hold secrets, like stack.json."""

    def _open(self):  # type: ignore[no-untyped-def]  # (the stdlib's signature)
        stream = super()._open()
        os.fchmod(stream.fileno(), 0o600)
        return stream


class StackLog:
    """Owns fds 1 and 2 of this process until `close()`."""

    def __init__(self, path: Path, *, max_bytes: int, backups: int) -> None:
        self.path = path
        self._handler = _PrivateFile(
            path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
        )
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        read, write = os.pipe()
        self._saved = (os.dup(1), os.dup(2))
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        self._reader = threading.Thread(
            target=self._pump, args=(read,), name="stack-log", daemon=True
        )
        self._reader.start()

    def _pump(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            while raw := pipe.readline(MAX_LINE):
                line = raw.decode(errors="replace").rstrip("\n")
                if line.strip():
                    self._write(wrap(line, service="aenv", stream="stderr"))

    def _write(self, line: str) -> None:
        self._handler.handle(logging.LogRecord("aenv.stack", logging.INFO, "", 0, line, None, None))

    def close(self, timeout: float = 2.0) -> None:
        """Fds 1 and 2 back to what they were; the lines still in the pipe written first."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        self._reader.join(timeout)
        self._handler.close()
