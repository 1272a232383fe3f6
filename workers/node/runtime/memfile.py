"""Copying guest RAM files without touching their holes.

A 512 MiB guest that booted has ~100 MiB of pages ever written; the rest of its RAM file is
holes. A reflink (FICLONE) is O(1) where the filesystem supports it; otherwise copy only
the data extents (SEEK_DATA/SEEK_HOLE + copy_file_range), so cost tracks the pages used,
not the guest's RAM size.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from shared.sparse import data_extents

FICLONE = 0x40049409
#: Bytes copied between two calls of `pause_point` (a background copy stops there for a
#: restore or pause that started meanwhile).
CHUNK = 8 << 20


def clone_or_sparse_copy(
    src: Path, dst: Path, pause_point: Callable[[], None] | None = None
) -> str:
    """Copy `src` to `dst` preserving holes; returns "reflink" or "sparse"."""
    if reflink(src, dst):
        return "reflink"
    sparse_copy(src, dst, pause_point)
    return "sparse"


def reflink(src: Path, dst: Path) -> bool:
    """Make `dst` a reflink of `src` (O(1), shares blocks); False where the filesystem (or
    the pair of filesystems) cannot, and then `dst` is left absent."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        try:
            fcntl.ioctl(fo.fileno(), FICLONE, fi.fileno())
            return True
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY):
                raise
    dst.unlink()
    return False


def sparse_copy(
    src: Path, dst: Path, pause_point: Callable[[], None] | None = None, *, into: bool = False
) -> None:
    """Copy only the data extents of `src` into `dst`, made the same size: a new file, or
    with `into` the existing one (a prepared file whose blocks are already allocated).
    Within one filesystem `copy_file_range`; across two (a RAM copy staged in tmpfs)
    `sendfile`, since `copy_file_range` refuses most cross-filesystem pairs."""
    flags = os.O_WRONLY | (os.O_CREAT | os.O_TRUNC if not into else 0)
    with open(src, "rb") as fi, os.fdopen(os.open(dst, flags, 0o644), "wb") as fo:
        fdi, fdo = fi.fileno(), fo.fileno()
        os.ftruncate(fdo, os.fstat(fdi).st_size)
        same_fs = os.fstat(fdi).st_dev == os.fstat(fdo).st_dev
        for data, hole in data_extents(fdi, os.fstat(fdi).st_size):
            off = data
            if not same_fs:
                os.lseek(fdo, off, os.SEEK_SET)  # sendfile writes at the file position
            while off < hole:
                count = min(hole - off, CHUNK)
                if same_fs:
                    n = os.copy_file_range(fdi, fdo, count, off, off)
                else:
                    n = os.sendfile(fdo, fdi, off, count)
                if n == 0:
                    break
                off += n
                if pause_point is not None:
                    pause_point()


#: The guest's page: the unit a hole is punched in.
PAGE = 4096
_ZERO_PAGE = bytes(PAGE)
_READ = 1 << 20
_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def punch_zero_pages(path: Path) -> int:
    """Turn the all-zero pages of RAM file `path` into holes; the bytes freed.

    A booted guest's RAM file holds pages it touched that hold only zeros (a template's:
    ~33 of 128 MiB). As holes they read back the same — to a restore's mapping, a sparse
    copy, an upload — and every copy made from the file (the RAM pool's, a sandbox's own)
    is smaller by as much. Only for a file nobody writes (a template's capture): a page a
    writer dirtied after it was read here would be lost."""
    before = allocated_bytes(path)
    fd = os.open(path, os.O_RDWR)
    try:
        for start, end in data_extents(fd, os.fstat(fd).st_size):
            for off in range(start, end, _READ):
                buf = os.pread(fd, min(_READ, end - off), off)
                for first, last in zero_runs(buf):
                    _punch(fd, off + first, last - first)
    finally:
        os.close(fd)
    return before - allocated_bytes(path)


def zero_runs(buf: bytes) -> list[tuple[int, int]]:
    """[start, end) runs of whole zero pages in `buf` (a trailing part page is kept)."""
    runs: list[tuple[int, int]] = []
    view = memoryview(buf)
    start: int | None = None
    whole = len(buf) - len(buf) % PAGE
    for at in range(0, whole, PAGE):
        if view[at : at + PAGE] == _ZERO_PAGE:
            start = at if start is None else start
        elif start is not None:
            runs.append((start, at))
            start = None
    if start is not None:
        runs.append((start, whole))
    return runs


def _punch(fd: int, offset: int, length: int) -> None:
    if _libc.fallocate(fd, _PUNCH_HOLE, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"punching a hole: {os.strerror(err)}")


def allocated_bytes(path: Path) -> int:
    """Bytes actually allocated on disk (what a copy or upload of this file costs)."""
    return os.stat(path).st_blocks * 512
