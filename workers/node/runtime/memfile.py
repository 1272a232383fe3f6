"""Copying guest RAM files without touching their holes.

A 512 MiB guest that booted has ~100 MiB of pages ever written; the rest of its RAM file is
holes. A reflink (FICLONE) is O(1) where the filesystem supports it; otherwise copy only
the data extents (SEEK_DATA/SEEK_HOLE + copy_file_range), so cost tracks the pages used,
not the guest's RAM size.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

FICLONE = 0x40049409
#: Bytes copied between two calls of `pause_point` (a background copy stops there for a
#: restore or pause that started meanwhile).
CHUNK = 8 << 20


def clone_or_sparse_copy(
    src: Path, dst: Path, pause_point: Callable[[], None] | None = None
) -> str:
    """Copy `src` to `dst` preserving holes; returns "reflink" or "sparse"."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        try:
            fcntl.ioctl(fo.fileno(), FICLONE, fi.fileno())
            return "reflink"
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY):
                raise
        size = os.fstat(fi.fileno()).st_size
        os.ftruncate(fo.fileno(), size)
        fdi, fdo = fi.fileno(), fo.fileno()
        pos = 0
        while pos < size:
            try:
                data = os.lseek(fdi, pos, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # only a hole remains
                    break
                raise
            hole = os.lseek(fdi, data, os.SEEK_HOLE)
            off = data
            while off < hole:
                n = os.copy_file_range(fdi, fdo, min(hole - off, CHUNK), off, off)
                if n == 0:
                    break
                off += n
                if pause_point is not None:
                    pause_point()
            pos = hole
        return "sparse"


def allocated_bytes(path: Path) -> int:
    """Bytes actually allocated on disk (what a copy or upload of this file costs)."""
    return os.stat(path).st_blocks * 512
