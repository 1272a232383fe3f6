"""Directory watches on Linux inotify, through ctypes (the stdlib has no binding).

Events are those E2B's envd reports through its fsnotify fork (github e2b-dev/fsnotify
v0.0.1, backend_inotify.go handleEvent/newEvent; envd's services/filesystem/watch.go):
create/moved-to -> CREATE, modify -> WRITE, delete/delete-self -> REMOVE,
moved-from/move-self -> RENAME, attrib -> CHMOD, one event per kind in the order CREATE,
RENAME, CHMOD, WRITE, REMOVE. In a recursive watch a subdirectory's own delete-self and
move-self are dropped (its parent reports them), and a directory that appears in the tree
other than by a rename inside it (mkdir, a move in from outside) is announced with a CREATE
for everything already in it, walked in name order: `mkdir -p a/b/c` or `mv ~/tree .`
report a, a/b, a/b/c. A moved watch root ends the watch, after a RENAME of ".".
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import struct
from collections import deque
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
IN_UNMOUNT = 0x00002000
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


#: inotify bits behind each event type, in the order fsnotify's envd emits them.
_KINDS = (
    (IN_CREATE | IN_MOVED_TO, wire.EVENT_CREATE),
    (IN_MOVED_FROM | IN_MOVE_SELF, wire.EVENT_RENAME),
    (IN_ATTRIB, wire.EVENT_CHMOD),
    (IN_MODIFY, wire.EVENT_WRITE),
    (IN_DELETE | IN_DELETE_SELF, wire.EVENT_REMOVE),
)
#: fsnotify remembers this many rename cookies to tell a rename inside the tree from a move in
RENAME_COOKIES = 10


def event_types(mask: int) -> list[str]:
    """The events one inotify event is reported as (one per kind, E2B's order)."""
    return [etype for bits, etype in _KINDS if mask & bits]


def parse_events(buf: bytes) -> list[tuple[int, int, int, str]]:
    """(wd, mask, cookie, name) for each `struct inotify_event` in a read buffer."""
    out: list[tuple[int, int, int, str]] = []
    off = 0
    while off + _HEADER.size <= len(buf):
        wd, mask, cookie, length = _HEADER.unpack_from(buf, off)
        off += _HEADER.size
        raw = buf[off : off + length].split(b"\0", 1)[0]
        off += length
        out.append((wd, mask, cookie, os.fsdecode(raw)))
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
        self.paths: dict[int, str] = {}  # wd -> the directory it watches
        self.wds: dict[str, int] = {}  # and back
        self.root_wd = -1
        self.moved_from: deque[int] = deque(maxlen=RENAME_COOKIES)

    def start(self) -> None:
        lib = _lib()
        fd = lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd = fd
        try:
            self.root_wd = self._add(self.root)
            if self.recursive:
                self._add_tree(self.root)
        except BaseException:
            os.close(fd)
            self.fd = -1
            raise
        self.loop.add_reader(fd, self._on_readable)

    def _add(self, path: str) -> int:
        wd: int = _lib().inotify_add_watch(self.fd, os.fsencode(path), WATCH_MASK)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
        # a directory renamed inside the tree keeps its wd: it is found under its new path
        self._forget(wd)
        self.paths[wd] = path
        self.wds[path] = wd
        return wd

    def _forget(self, wd: int) -> None:
        old = self.paths.pop(wd, None)
        if old is not None and self.wds.get(old) == wd:
            del self.wds[old]

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
        for wd, mask, cookie, name in parse_events(buf):
            self.handle(wd, mask, cookie, name)

    def handle(self, wd: int, mask: int, cookie: int, name: str) -> None:
        """Report one inotify event as fsnotify's envd does (see the module docstring)."""
        if mask & (IN_IGNORED | IN_UNMOUNT):
            self._forget(wd)
            return
        base = self.paths.get(wd)
        if base is None:
            return
        path = os.path.join(base, name) if name else base
        if mask & IN_DELETE_SELF:
            self._forget(wd)
            if os.path.dirname(base) in self.wds:
                return  # the parent's IN_DELETE reports it
        if mask & IN_MOVE_SELF:
            if wd != self.root_wd:
                return  # the parent's IN_MOVED_FROM reports it
            self._emit(wire.EVENT_RENAME, path)
            self.paths.clear()  # fsnotify removes the root's watches: nothing more comes
            self.wds.clear()
            self.close()
            return
        if mask & IN_MOVED_FROM and cookie:
            self.moved_from.append(cookie)
        for etype in event_types(mask):
            self._emit(etype, path)
        if self.recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
            renamed = bool(mask & IN_MOVED_TO) and cookie in self.moved_from
            self._watch_new(path, announce=not renamed)

    def _watch_new(self, top: str, announce: bool) -> None:
        """Watch a directory new to the tree and all directories in it; unless it was only
        renamed inside the tree, report a CREATE for each entry in it, depth first in name
        order (fsnotify's WalkDir). A directory gone meanwhile is skipped."""
        try:
            self._add(top)
        except OSError:
            return
        stack = [iter(_children(top))]
        while stack:
            entry = next(stack[-1], None)
            if entry is None:
                stack.pop()
                continue
            if announce:
                self._emit(wire.EVENT_CREATE, entry.path)
            try:
                if entry.is_dir(follow_symlinks=False):
                    self._add(entry.path)
                    stack.append(iter(_children(entry.path)))
            except OSError:
                continue

    def _emit(self, etype: str, path: str) -> None:
        self.sink(etype, os.path.relpath(path, self.root), path)

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1


def _children(directory: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


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
