"""Where a sparse file holds data: the node copies guest RAM files by their data extents
(holes stay holes), and the snapshot worker chunks them the same way for upload.

Blocking helpers: callers run them in a thread.
"""

from __future__ import annotations

import errno
import os

__all__ = ["data_extents"]


def data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """[start, end) ranges of `fd` that hold data; everything else is a hole.

    On filesystems without hole reporting the whole file is one extent (still correct,
    just slower: every chunk is read and zero chunks are detected by content).
    """
    out: list[tuple[int, int]] = []
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole remains
                break
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        out.append((start, end))
        pos = end
    return out
