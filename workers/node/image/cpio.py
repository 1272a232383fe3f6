"""A newc ("070701") cpio writer: the format the Linux kernel unpacks as an initramfs.

Written in Python rather than piping to `cpio` so the archive can hold device nodes
(`/dev/console`) and root ownership without the builder running as root, and so its
bytes depend only on its inputs.
"""

from __future__ import annotations

import stat
from typing import BinaryIO

TRAILER = "TRAILER!!!"


def _pad4(n: int) -> bytes:
    return b"\0" * (-n % 4)


class CpioWriter:
    """Append entries to a binary stream; `close()` writes the trailer (the stream stays open)."""

    def __init__(self, out: BinaryIO, *, mtime: int = 0) -> None:
        self._out = out
        self._ino = 1
        self._mtime = mtime
        self._closed = False

    def _entry(
        self,
        name: str,
        mode: int,
        data: bytes = b"",
        *,
        uid: int = 0,
        gid: int = 0,
        rdev: tuple[int, int] = (0, 0),
        nlink: int = 1,
    ) -> None:
        if self._closed:
            raise ValueError("cpio archive already closed")
        name = name.lstrip("/") or "."
        encoded = name.encode() + b"\0"
        fields = (
            self._ino,
            mode,
            uid,
            gid,
            nlink,
            self._mtime,
            len(data),
            0,
            0,
            rdev[0],
            rdev[1],
            len(encoded),
            0,
        )
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        self._out.write(header + encoded + _pad4(len(header) + len(encoded)))
        self._out.write(data + _pad4(len(data)))
        self._ino += 1

    def add_dir(self, name: str, mode: int = 0o755) -> None:
        """A directory; parents must be added first (the kernel does not create them)."""
        self._entry(name, stat.S_IFDIR | mode, nlink=2)

    def add_file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        """A regular file with the given contents."""
        self._entry(name, stat.S_IFREG | mode, data)

    def add_symlink(self, name: str, target: str) -> None:
        """A symbolic link; cpio stores the target as the entry's data."""
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def add_chardev(self, name: str, major: int, minor: int, mode: int = 0o600) -> None:
        """A character device node (e.g. /dev/console, 5:1)."""
        self._entry(name, stat.S_IFCHR | mode, rdev=(major, minor))

    def close(self) -> None:
        """Write the trailer entry that ends the archive."""
        self._entry(TRAILER, 0, nlink=1)
        self._closed = True
