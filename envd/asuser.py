"""Filesystem work done as the user a request names, with that user's permissions.

envd runs as root, but E2B's files API acts as the request's user (`username` on /files,
Basic auth on the RPCs; default `user`): reading `/etc/shadow` as `user` must fail as it
would for `user`. So the kernel decides, not envd: each operation runs in a child forked
for it that has become the user (`setgroups`, `setresgid`, `setresuid`). Every rule the
kernel applies then holds — modes, groups, ACLs, sticky directories, read-only mounts —
and there is no gap between a check and the use that a symlink swapped in between could
exploit, as there would be with envd comparing modes along the path itself.

Why a fork per operation: credentials belong to the whole process for Python (there is
no `setfsuid`, and `setresuid` in envd would change who every other request acts as
while the loop runs on), and a long-lived helper per user would be one more thing to
supervise. envd is single-threaded (see `envd.__main__`), which makes `fork` safe; the
child touches nothing of the event loop and leaves with `os._exit`. A fork of envd costs
about a millisecond. After the uid change the kernel makes the child non-dumpable, so the
user cannot reach the envd descriptors it inherited through /proc.

Results come back over a socketpair as JSON; an opened file comes back as its descriptor
(SCM_RIGHTS), so envd itself moves the data (sendfile, the upload buffer) — only the
opening is the user's. An `OSError` in the child is raised again in envd with its errno,
so `except PermissionError` and friends work unchanged around these calls.
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

from envd.users import User

__all__ = ["open_as", "run_as"]

_HEADER = struct.Struct("!Q")
_READ = 256 * 1024


async def run_as(user: User, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` as `user`; its result must be JSON-serialisable."""
    result, _ = await _call(user, False, fn, *args)
    return result


async def open_as(user: User, fn: Callable[..., int], *args: Any) -> int:
    """The file descriptor `fn(*args)` opens as `user`, now envd's (the caller closes it)."""
    _, fds = await _call(user, True, fn, *args)
    return fds[0]


async def _call(
    user: User, wants_fd: bool, fn: Callable[..., Any], *args: Any
) -> tuple[Any, list[int]]:
    if user.is_current:  # envd is this user already (root asking as root; host tests)
        result = fn(*args)
        return (None, [result]) if wants_fd else (result, [])
    groups = user.groups()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; its effects are what the tests check
        try:
            ours.close()
            _child(theirs, user, groups, wants_fd, fn, args)
        finally:
            os._exit(0)
    theirs.close()
    try:
        payload, fds = await _receive(ours)
    finally:
        ours.close()
        _reap(pid)
    if "errno" in payload:
        for fd in fds:
            os.close(fd)
        raise OSError(payload["errno"], payload["strerror"], payload.get("filename"))
    if "error" in payload or (wants_fd and len(fds) != 1):
        for fd in fds:
            os.close(fd)
        raise RuntimeError(f"file operation as {user.name} failed: {payload.get('error')}")
    return payload.get("ok"), fds


def _child(
    sock: socket.socket,
    user: User,
    groups: list[int],
    wants_fd: bool,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    fds: list[int] = []
    try:
        signal.set_wakeup_fd(-1)  # the parent loop's: a signal here must not wake it
        _close_inherited(sock.fileno())
        os.setgroups(groups)
        os.setresgid(user.gid, user.gid, user.gid)
        os.setresuid(user.uid, user.uid, user.uid)
        result = fn(*args)
        if wants_fd:
            fds, result = [result], None
        payload: dict[str, Any] = {"ok": result}
        data = json.dumps(payload).encode()
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
    message = _HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [message[:_READ]], fds) if fds else sock.send(message[:_READ])
    sock.sendall(message[sent:])


def _close_inherited(keep: int) -> None:
    """Close envd's descriptors (listening socket, client connections, the loop's): a child
    stuck on a slow filesystem must not keep a connection open that envd has closed."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            with contextlib.suppress(OSError):
                os.close(fd)


async def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One framed message (and the descriptors that came with its first bytes)."""
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    buf = bytearray()
    fds: list[int] = []
    need = _HEADER.size
    while len(buf) < need:
        try:
            data, got, _, _ = socket.recv_fds(sock, _READ, 1)
        except BlockingIOError:
            await _readable(loop, sock.fileno())
            continue
        fds.extend(got)
        if not data:
            for fd in fds:
                os.close(fd)
            raise RuntimeError("file operation ended without an answer")
        buf += data
        if need == _HEADER.size and len(buf) >= need:
            need += _HEADER.unpack_from(buf)[0]
    return json.loads(bytes(buf[_HEADER.size : need])), fds


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
