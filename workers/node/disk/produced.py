"""Writes under the disk budget: a reservation made before, and what the write left
charged after, by listing the directories it adds to (cheap: no walk of what was there).

And how much an OCI import will write, known before it writes: the layers' compressed
sizes (the registry's manifest) for the pull, their uncompressed sizes (each gzip
member's trailer) for the unpacked chain and the root disk made from it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from workers.node.disk.budget import DiskBudget, Reservation
from workers.node.disk.shares import made

__all__ = ["disk_need", "names", "unpacked_bytes", "writing", "writing_async"]

#: what a root disk holds beside its tree: the ext4 journal and metadata, the kernel and
#: initramfs files of its entry (a guess with room to spare; the charge is measured)
DISK_EXTRA = 160 << 20
#: what a write leaves beside what it lists: lock files, `recipes/` and `names/` links,
#: directories' own blocks growing (charged as is: high, never low)
METADATA = 1 << 20
_GZIP, _ZSTD = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"
_ZSTD_RATIO = 4  # no size in a zstd layer's trailer: assume it unpacks to this many times


def names(directory: Path) -> set[str]:
    """What `directory` holds now (nothing if it is not there): compared before and after
    a write, what the write made."""
    try:
        return set(os.listdir(directory))
    except OSError:
        return set()


@contextmanager
def writing(
    budget: DiskBudget, nbytes: int, dirs: Iterable[Path], *, refuse: bool = True
) -> Iterator[Reservation]:
    """Reserve `nbytes` (evicting if needed; `NoRoom` if it cannot fit), then charge what
    appeared in `dirs` meanwhile, less what it links to that was there before
    (`shares.made`: watch every directory the write makes new links in, or what it links
    from an unwatched one goes uncharged). Two writers into one directory at once both
    charge what either added: counted high until the next walk, never low. `refuse=False`:
    over the limit it goes ahead anyway (`DiskBudget.reserve`)."""
    watched = list(dirs)
    before = {d: names(d) for d in watched}
    with budget.reserve(nbytes, refuse=refuse) as r:
        try:
            yield r
        finally:
            new = [d / n for d in watched for n in names(d) - before[d]]
            r.charge(made(new) + METADATA)


@asynccontextmanager
async def writing_async(
    budget: DiskBudget, nbytes: int, dirs: Iterable[Path], *, refuse: bool = True
) -> AsyncIterator[Reservation]:
    """`writing` from the event loop: making room (an eviction: rmtree) and measuring what
    was left run in a thread."""
    held = writing(budget, nbytes, dirs, refuse=refuse)
    r = await asyncio.to_thread(held.__enter__)
    try:
        yield r
    except BaseException:
        await asyncio.to_thread(held.__exit__, *sys.exc_info())
        raise
    await asyncio.to_thread(held.__exit__, None, None, None)


def unpacked_bytes(blob: Path) -> int:
    """What a layer blob unpacks to: a gzip member's ISIZE (modulo 4 GiB, so lifted to at
    least the compressed size), a zstd layer's compressed size times `_ZSTD_RATIO`, an
    uncompressed tar's own size."""
    size = blob.stat().st_size
    with blob.open("rb") as f:
        magic = f.read(4)
        if magic[:2] == _GZIP and size >= 18:
            f.seek(size - 4)
            isize = int.from_bytes(f.read(4), "little")
            while isize < size:
                isize += 1 << 32
            return isize
    if magic == _ZSTD:
        return size * _ZSTD_RATIO
    return size


def disk_need(unpacked: int) -> int:
    """Room an OCI build takes at its peak: the unpacked chain, the root disk made from the
    same tree (plus a tenth for ext4's metadata) and `DISK_EXTRA`."""
    return unpacked * 2 + unpacked // 10 + DISK_EXTRA
