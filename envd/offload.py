"""Filesystem work of unbounded length, done in a child forked for it so the loop runs on.

Most file operations are a few syscalls on one inode (stat, open, mkdir, rename, unlink,
chown) and run in envd itself (`envd.fsops`). Three walk a tree whose size the request
does not bound: a listing, the removal of a directory, a move across filesystems (a copy).
In envd they would stall every other request and every process's output for as long as
they take — seconds for a large tree, more under TCG — and envd has no thread to give
them: it stays single-threaded, because its PTY children are forked with a preexec hook
(see `envd.__main__`). So they run in a child forked for the call, with envd's own
credentials (root in the guest, as E2B's envd does them); a fork of envd costs 1 to 3 ms.
The child touches nothing of the event loop and leaves with `os._exit`.

The result comes back over a socketpair as JSON. An `OSError` in the child is raised
again in envd with its errno, so `except PermissionError` and friends work unchanged.
A request cancelled meanwhile leaves the child to finish (a half-removed tree would be
worse) and reaps it later.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["run"]

_HEADER = struct.Struct("!Q")
_READ = 256 * 1024


async def run(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a forked child; its result must be JSON-serialisable."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; its effects are what the tests check
        try:
            ours.close()
            _child(theirs, fn, args)
        finally:
            os._exit(0)
    theirs.close()
    try:
        payload = await _receive(ours)
    finally:
        ours.close()
        _reap(pid)
    if "errno" in payload:
        raise OSError(payload["errno"], payload["strerror"], payload.get("filename"))
    if "error" in payload:
        raise RuntimeError(f"file operation failed: {payload['error']}")
    return payload.get("ok")


def _child(sock: socket.socket, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        signal.set_wakeup_fd(-1)  # the parent loop's: a signal here must not wake it
        _close_inherited(sock.fileno())
        data = json.dumps({"ok": fn(*args)}).encode()
    except OSError as e:
        data = json.dumps(
            {
                "errno": e.errno,
                "strerror": e.strerror,
                "filename": e.filename if isinstance(e.filename, str) else None,
            }
        ).encode()
    except BaseException as e:  # a bug, reported rather than lost with the child
        data = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _close_inherited(keep: int) -> None:
    """Close envd's descriptors (listening socket, client connections, the loop's): a child
    stuck on a slow filesystem must not keep a connection open that envd has closed."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            with contextlib.suppress(OSError):
                os.close(fd)


async def _receive(sock: socket.socket) -> dict[str, Any]:
    """One framed message."""
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    buf = bytearray()
    need = _HEADER.size
    while len(buf) < need:
        try:
            data = sock.recv(_READ)
        except BlockingIOError:
            await _readable(loop, sock.fileno())
            continue
        if not data:
            raise RuntimeError("file operation ended without an answer")
        buf += data
        if need == _HEADER.size and len(buf) >= need:
            need += _HEADER.unpack_from(buf)[0]
    result: dict[str, Any] = json.loads(bytes(buf[_HEADER.size : need]))
    return result


async def _readable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await fut
    finally:
        loop.remove_reader(fd)


def _reap(pid: int) -> None:
    """Collect the child without blocking the loop: it has answered and is exiting, or the
    request was cancelled while it works (a large rmtree) and it exits when done."""
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            asyncio.get_running_loop().call_later(0.05, _reap, pid)
