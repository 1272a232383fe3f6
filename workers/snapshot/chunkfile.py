"""A sparse file (guest RAM, a volume image) to and from a store as content-addressed chunks.

Shared by snapshots (their `mem`) and volume images: both are large, mostly holes, and
change a few chunks between two uploads. `concurrency` workers each hold one chunk in
memory at a time, which bounds both memory and the connections a node opens to S3.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from shared.sparse import data_extents
from workers.snapshot import chunks
from workers.snapshot.errors import LayoutError
from workers.snapshot.manifest import MemoryRef
from workers.snapshot.sender import BlobSender
from workers.snapshot.store import BlobSource
from workers.snapshot.tasks import run_workers

__all__ = ["download_chunks", "upload_chunks"]


async def upload_chunks(
    fd: int, path: Path, sender: BlobSender, *, chunk_size: int, concurrency: int
) -> MemoryRef:
    """Chunks with data, hashed and sent by `concurrency` workers (one chunk each in
    memory at a time); holes are never read, zero chunks never stored. `fd` stays open
    until the sender's recheck, which may read a chunk again."""
    size = os.fstat(fd).st_size
    cs = chunk_size
    digests: list[str | None] = [None] * chunks.chunk_count(size, cs)
    extents = await asyncio.to_thread(data_extents, fd, size)
    todo = iter(chunks.chunks_touching(extents, cs))

    def reread(i: int) -> Callable[[], Awaitable[BlobSource]]:
        async def read() -> BlobSource:
            got = await asyncio.to_thread(chunks.read_chunk, fd, i, cs, size)
            if got is None or got[0] != digests[i]:
                raise LayoutError(f"{path} changed during upload (chunk {i})")
            return got[1]

        return read

    async def worker() -> None:
        for i in todo:
            got = await asyncio.to_thread(chunks.read_chunk, fd, i, cs, size)
            if got is not None:
                digests[i] = got[0]
                await sender.ensure(got[0], reread(i), got[1])

    await run_workers(concurrency, worker)
    return MemoryRef(size=size, chunk_size=cs, chunks=tuple(digests))


async def download_chunks(
    ref: MemoryRef,
    dest: Path,
    load: Callable[[str], Awaitable[Path]],
    *,
    concurrency: int,
    discard: bool = False,
) -> Path:
    """Rebuild the file `ref` describes at `dest`, sparse (only chunks with data written),
    under a private name until it is whole: `load` gives a chunk's blob as a local file.
    `discard`: each loaded file was fetched for this placement alone (not a cache entry)
    and is removed once placed, so at most `concurrency` chunks sit beside the file."""
    tmp = dest.with_name(dest.name + ".part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, ref.size)  # all holes; only chunks with data get written
        todo = iter([(i, d) for i, d in enumerate(ref.chunks) if d is not None])

        async def worker() -> None:
            for i, digest in todo:
                blob = await load(digest)
                try:
                    await asyncio.to_thread(_place_chunk, fd, i * ref.chunk_size, blob)
                finally:
                    if discard:
                        blob.unlink(missing_ok=True)

        await run_workers(concurrency, worker)
        await asyncio.to_thread(os.fsync, fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, dest)
    return dest


def _place_chunk(fd: int, offset: int, blob: Path) -> None:
    chunks.write_sparse(fd, offset, blob.read_bytes())
