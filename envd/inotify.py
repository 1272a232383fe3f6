"""Directory watches on Linux inotify, through ctypes (the stdlib has no binding).

Event mapping follows fsnotify, which the real envd uses: create/moved-to -> CREATE,
modify -> WRITE, delete -> REMOVE, moved-from/move-self -> RENAME, attrib -> CHMOD.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import struct
from collections.abc import Callable

from envd import wire

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_IGNORED = 0x00008000
IN_ISDIR = 0x40000000
IN_Q_OVERFLOW = 0x00004000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

WATCH_MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)

_HEADER = struct.Struct("iIII")
_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        _libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return _libc


def event_type(mask: int) -> str | None:
    if mask & (IN_CREATE | IN_MOVED_TO):
        return wire.EVENT_CREATE
    if mask & (IN_DELETE | IN_DELETE_SELF):
        return wire.EVENT_REMOVE
    if mask & IN_MODIFY:
        return wire.EVENT_WRITE
    if mask & (IN_MOVED_FROM | IN_MOVE_SELF):
        return wire.EVENT_RENAME
    if mask & IN_ATTRIB:
        return wire.EVENT_CHMOD
    return None


def parse_events(buf: bytes) -> list[tuple[int, int, str]]:
    """(wd, mask, name) for each `struct inotify_event` in a read buffer."""
    out: list[tuple[int, int, str]] = []
    off = 0
    while off + _HEADER.size <= len(buf):
        wd, mask, _cookie, length = _HEADER.unpack_from(buf, off)
        off += _HEADER.size
        raw = buf[off : off + length].split(b"\0", 1)[0]
        off += length
        out.append((wd, mask, os.fsdecode(raw)))
    return out


EventSink = Callable[[str, str, str], None]  # (event type, relative name, absolute path)


class DirWatcher:
    """One inotify instance watching a directory, optionally its whole subtree."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, root: str, recursive: bool, sink: EventSink
    ) -> None:
        self.loop = loop
        self.root = root
        self.recursive = recursive
        self.sink = sink
        self.fd = -1
        self.paths: dict[int, str] = {}

    def start(self) -> None:
        lib = _lib()
        fd = lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd = fd
        try:
            self._add(self.root)
            if self.recursive:
                self._add_tree(self.root)
        except BaseException:
            os.close(fd)
            self.fd = -1
            raise
        self.loop.add_reader(fd, self._on_readable)

    def _add(self, path: str) -> None:
        wd = _lib().inotify_add_watch(self.fd, os.fsencode(path), WATCH_MASK)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
        self.paths[wd] = path

    def _add_tree(self, top: str) -> None:
        for dirpath, dirnames, _ in os.walk(top):
            for d in dirnames:
                p = os.path.join(dirpath, d)
                if not os.path.islink(p):
                    with contextlib.suppress(OSError):
                        self._add(p)

    def _on_readable(self) -> None:
        try:
            buf = os.read(self.fd, 64 * 1024)
        except BlockingIOError:
            return
        except OSError:
            self.close()
            return
        for wd, mask, name in parse_events(buf):
            if mask & IN_IGNORED:
                self.paths.pop(wd, None)
                continue
            base = self.paths.get(wd)
            if base is None:
                continue
            path = os.path.join(base, name) if name else base
            if self.recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                try:
                    self._add(path)
                    self._add_tree(path)
                except OSError:
                    pass
            etype = event_type(mask)
            if etype is None:
                continue
            rel = os.path.relpath(path, self.root)
            self.sink(etype, rel, path)

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1


NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "sshfs"}


def is_network_mount(path: str) -> bool:
    """True when `path` lives on a network or FUSE filesystem (inotify is unreliable there)."""
    best, fstype = "", ""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 10 or "-" not in fields:
                    continue
                mnt = fields[4].replace("\\040", " ")
                sep = fields.index("-")
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best):
                    best, fstype = mnt, fields[sep + 1]
    except OSError:
        return False
    return fstype in NETWORK_FS or fstype.startswith("fuse")
