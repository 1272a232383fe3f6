"""sha256 over files and streams, in bounded memory.

Every blob is named by the sha256 of its bytes, and every download is checked against
that name while it is written, so a truncated or corrupted object never lands as a layer.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from workers.snapshot.errors import CorruptBlob

IO_CHUNK = 1 << 20  # 1 MiB reads: large enough for throughput, small enough to never matter


def file_digest(path: Path) -> tuple[str, int]:
    """(sha256 hex, size) of a whole file, read in 1 MiB pieces (blocking: run in a thread)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while piece := f.read(IO_CHUNK):
            h.update(piece)
            size += len(piece)
    return h.hexdigest(), size


class VerifyingWriter:
    """Writes a blob to a temp file beside `dest`, hashing as it goes; `commit` renames it
    into place only if the bytes match the expected digest (atomic: readers never see a
    partial file)."""

    def __init__(self, dest: Path, expected: str):
        self.dest = dest
        self.expected = expected
        self.tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{id(self):x}.part")
        dest.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.tmp, "wb")  # noqa: SIM115 - closed in commit/abort
        self._h = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | memoryview) -> None:
        self._h.update(data)
        self._f.write(data)
        self.size += len(data)

    def commit(self) -> int:
        self._f.close()
        got = self._h.hexdigest()
        if got != self.expected:
            self.tmp.unlink(missing_ok=True)
            raise CorruptBlob(f"blob {self.expected} arrived as {got} ({self.size} bytes)")
        os.replace(self.tmp, self.dest)
        return self.size

    def abort(self) -> None:
        self._f.close()
        self.tmp.unlink(missing_ok=True)
