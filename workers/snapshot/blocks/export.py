"""An export: one image's disk, as the repository lists it, read by byte range over chunks.

The export's name is the image's content digest, so its manifest must list chunks that make
up exactly that digest (`diskdigest`): a manifest that lies is not served. A read is cut at
chunk boundaries; null (all-zero) chunks are zeros with no I/O; the chunks with data are
fetched through the shared `ChunkCache` (concurrently, when a read spans two) and then read
with one `preadv` per chunk into a single buffer from the chunk's kept-open file. A warm
read (`read_now`) is served on the spot; the rest (`read`) wait for fetches and the disk.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from shared import diskdigest
from workers.snapshot.blocks.chunkcache import ChunkCache
from workers.snapshot.blocks.stats import BlockStats, ExportStats
from workers.snapshot.blocks.trace import TraceRecorder
from workers.snapshot.errors import LayoutError, ManifestNotFound
from workers.snapshot.images import ImageRepository
from workers.snapshot.manifest import MemoryRef

__all__ = ["Export", "Exports", "Segment", "segments"]

log = logging.getLogger(__name__)

_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Segment:
    """A piece of a read inside one chunk: `length` bytes at `offset` in chunk `digest`
    (None: a zero chunk), landing at `at` in the read's buffer."""

    digest: str | None
    offset: int
    length: int
    at: int


def segments(disk: MemoryRef, offset: int, length: int) -> list[Segment]:
    """`[offset, offset+length)` of the disk cut at chunk boundaries (pure)."""
    cs = disk.chunk_size
    out: list[Segment] = []
    pos, end = offset, offset + length
    while pos < end:
        i, within = divmod(pos, cs)
        n = min(cs - within, end - pos)
        out.append(Segment(disk.chunks[i], within, n, pos - offset))
        pos += n
    return out


class Export:
    """One image's disk, read through the cache."""

    def __init__(
        self,
        digest: str,
        disk: MemoryRef,
        cache: ChunkCache,
        stats: ExportStats,
        *,
        readahead: int = 0,
    ):
        self.digest = digest
        self.disk = disk
        self.size = disk.size
        self.cache = cache
        self.stats = stats
        #: chunks fetched ahead of a sequential reader (0: none; each miss waits a fetch)
        self.readahead = readahead
        self._last = -2  # the last chunk index the latest read touched
        #: set while this export's first reads are recorded as its trace (`workingset`)
        self.recorder: TraceRecorder | None = None

    def _ahead(self, first: int, last: int) -> None:
        """A read that continues the previous one into a new chunk: start fetching the
        next `readahead` chunks with data, so a sequential reader finds them on its way
        rather than waiting one fetch per chunk. Reads elsewhere (random) start nothing."""
        previous, self._last = self._last, last
        if not self.readahead or first not in (previous, previous + 1) or last <= previous:
            return
        chunks = self.disk.chunks
        for d in chunks[last + 1 : last + 1 + self.readahead]:
            if d is not None:
                self.cache.prefetch(d, self._fetched)

    def _fetched(self, nbytes: int) -> None:
        self.stats.bytes_fetched += nbytes

    def _touched(self, offset: int, length: int) -> None:
        """Readahead and the trace see every read once, whichever path serves it."""
        cs = self.disk.chunk_size
        first, last = offset // cs, (offset + length - 1) // cs
        self._ahead(first, last)
        if self.recorder is not None:
            chunks = self.disk.chunks
            touched = (i for i in range(first, last + 1) if chunks[i] is not None)
            self.recorder.touch(touched, time.monotonic())

    def read_now(self, offset: int, length: int) -> bytearray | None:
        """`length` bytes at `offset` if the cache can give them without waiting: every
        chunk with data cached, its bytes in the page cache (RWF_NOWAIT), so a warm read
        costs no task, no thread and no await. None otherwise, with nothing counted or
        touched: the caller then awaits `read`. No await between a descriptor's lookup and
        its read, so no eviction can close it in between."""
        cs = self.disk.chunk_size
        chunks = self.disk.chunks
        cache = self.cache
        buf = bytearray(length)
        if not length:
            return buf  # (at the disk's end there is no chunk to look at)
        i, within = divmod(offset, cs)
        if within + length <= cs:  # one chunk: nearly every read
            digest = chunks[i]
            if digest is not None:
                fd = cache.open_fd(digest)
                if fd is None or not _pread_now(fd, buf, within):
                    return None
                cache.hit(digest)
        else:
            view = memoryview(buf)
            hits = []
            for seg in segments(self.disk, offset, length):
                if seg.digest is None:
                    continue
                fd = cache.open_fd(seg.digest)
                part = view[seg.at : seg.at + seg.length]
                if fd is None or not _pread_now(fd, part, seg.offset):
                    return None
                hits.append(seg.digest)
            for digest in dict.fromkeys(hits):
                cache.hit(digest)
        self._touched(offset, length)
        return buf

    async def read(self, offset: int, length: int) -> bytearray:
        """`length` bytes at `offset` (the caller checked the range), fetching the chunks
        that are missing and reading from disk in a thread."""
        segs = segments(self.disk, offset, length)
        buf = bytearray(length)
        self._touched(offset, length)
        wanted = sorted({s.digest for s in segs if s.digest is not None})
        if not wanted:
            return buf  # all zeros: no I/O at all
        cache = self.cache
        with cache.hold(wanted):  # held: no eviction closes their descriptors meanwhile
            files = {d: cache.cached(d) for d in wanted}
            missing = [d for d, p in files.items() if p is None]
            if missing:
                await asyncio.gather(*(cache.get(d, self._fetched) for d in missing))
            reads: list[tuple[int, Segment]] = []
            for s in segs:
                if s.digest is not None:
                    fd = cache.open_fd(s.digest)
                    if fd is None:  # its file vanished from under the cache
                        raise OSError(f"chunk {s.digest}: not in the cache after its fetch")
                    reads.append((fd, s))
            # the page cache usually has a fetched chunk: read it here, with no thread hop
            # (RWF_NOWAIT fails instead of blocking); else in a thread, off the loop
            if not _fill(buf, reads, os.RWF_NOWAIT):
                await asyncio.get_running_loop().run_in_executor(None, _fill, buf, reads, 0)
        return buf


def _pread_now(fd: int, into: bytearray | memoryview, offset: int) -> bool:
    """Fill `into` from `fd` at `offset` if the page cache holds it all."""
    try:
        return os.preadv(fd, (into,), offset, os.RWF_NOWAIT) == len(into)
    except BlockingIOError:
        return False


def _fill(buf: bytearray, reads: list[tuple[int, Segment]], flags: int) -> bool:
    """Read each segment into its place in `buf`; False when `flags` has RWF_NOWAIT and
    some bytes were not in the page cache (the caller reads again, blocking)."""
    view = memoryview(buf)
    for fd, seg in reads:
        try:
            got = os.preadv(fd, [view[seg.at : seg.at + seg.length]], seg.offset, flags)
        except BlockingIOError:
            return False
        if got != seg.length:
            if flags & os.RWF_NOWAIT:
                return False
            raise OSError(f"chunk {seg.digest}: {got} of {seg.length} bytes at {seg.offset}")
    return True


class Exports:
    """Exports by name, opened on first use from the image's manifest and kept."""

    def __init__(
        self,
        images: ImageRepository,
        cache: ChunkCache,
        stats: BlockStats,
        *,
        readahead: int = 0,
        on_open: Callable[[Export], None] | None = None,
    ):
        self.images = images
        self.cache = cache
        self.stats = stats
        self.readahead = readahead
        #: told of each export's first open (its trace is looked up or recorded then)
        self.on_open = on_open
        self._open: dict[str, Export] = {}

    def names(self) -> tuple[str, ...]:
        return tuple(self._open)

    def known(self, name: str) -> Export | None:
        return self._open.get(name)

    async def open(self, name: str) -> Export | None:
        """The export named `name`, or None when no image has that content digest (or its
        manifest does not describe it). Store errors other than absence propagate."""
        got = self._open.get(name)
        if got is not None:
            return got
        if not _DIGEST.fullmatch(name):
            return None
        try:
            manifest = await self.images.get_image_manifest(name)
        except ManifestNotFound:
            return None
        except LayoutError as e:
            log.warning("blocks: image %s not served: %s", name, e)
            return None
        disk = manifest.disk
        listed = diskdigest.disk_digest(disk.size, disk.chunk_size, disk.chunks)
        if manifest.digest != name or listed != name:
            log.warning("blocks: image %s: its manifest lists content %s; not served", name, listed)
            return None
        export = Export(
            name, disk, self.cache, self.stats.export(name, disk.size), readahead=self.readahead
        )
        self._open[name] = export
        if self.on_open is not None:
            self.on_open(export)
        log.info(
            "blocks: export %s opened (%d bytes, %d chunks)", name, disk.size, len(disk.chunks)
        )
        return export
