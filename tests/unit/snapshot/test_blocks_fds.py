"""The chunk cache's kept-open files, over a real (POSIX) store in a temporary directory:
a chunk's descriptor lives while a read holds the chunk, is closed when the chunk is
evicted (and by the descriptor cap, never under a held read), a chunk fetched again after
its eviction is read from its new file, and a file deleted from under the cache is fetched
again rather than failing the read."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from pathlib import Path

from aenv.roles.blocks import follow_cap
from shared.blockcap import write_cap
from workers.snapshot import PosixStore
from workers.snapshot.blocks.chunkcache import ChunkCache
from workers.snapshot.blocks.export import Export
from workers.snapshot.blocks.stats import BlockStats
from workers.snapshot.manifest import MemoryRef

CHUNK = 64 << 10


async def put(store: PosixStore, n: int) -> tuple[list[str], list[bytes]]:
    digests, blobs = [], []
    for _ in range(n):
        data = os.urandom(CHUNK)
        digest = hashlib.sha256(data).hexdigest()
        await store.put_blob(digest, data)
        digests.append(digest)
        blobs.append(data)
    return digests, blobs


def names_of(fd: int) -> str | None:
    """What descriptor `fd` of this process is open on now (None: closed)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:
        return None


class GatedStore(PosixStore):
    """A POSIX store whose fetch of one digest waits until `gate` is set (a slow S3)."""

    def __init__(self, root: Path, held: str):
        super().__init__(root)
        self.held = held
        self.gate = asyncio.Event()

    async def get_blob_to(self, digest: str, dest: Path) -> int:
        if digest == self.held:
            await self.gate.wait()
        return await super().get_blob_to(digest, dest)


def export_of(cache: ChunkCache, chunks: list[str]) -> Export:
    disk = MemoryRef(size=len(chunks) * CHUNK, chunk_size=CHUNK, chunks=tuple(chunks))
    return Export("e" * 64, disk, cache, BlockStats(cache).export("e" * 64, disk.size))


async def test_a_held_chunk_keeps_its_descriptor_through_eviction_then_it_is_closed(
    tmp_path: Path,
) -> None:
    store = PosixStore(tmp_path / "store")
    (a, b, c), (data_a, _, _) = await put(store, 3)
    cache = ChunkCache(tmp_path / "cache", store, CHUNK)  # room for one chunk
    with contextlib.ExitStack() as later:
        with cache.hold([a]):
            await cache.get(a)
            fd = cache.open_fd(a)
            assert fd is not None and cache.open_fd(a) == fd  # opened once, kept
            with cache.hold([b]):  # over the cap; a is held, so b goes once let go
                await cache.get(b)
            later.enter_context(cache.hold([c]))
            await cache.get(c)
            assert cache.path_for(a).exists() and names_of(fd) == str(cache.path_for(a))
            assert os.pread(fd, CHUNK, 0) == data_a
        # let go while c is held: a is the one chunk that can go, evicted now, file closed
        assert not cache.path_for(a).exists() and cache.path_for(c).exists()
        assert names_of(fd) != str(cache.path_for(a))
        assert cache.open_fd(a) is None and cache.open_fds == 0


async def test_a_chunk_fetched_again_after_eviction_is_read_from_its_new_file(
    tmp_path: Path,
) -> None:
    store = PosixStore(tmp_path / "store")
    digests, blobs = await put(store, 3)
    cache = ChunkCache(tmp_path / "cache", store, 2 * CHUNK)
    export = export_of(cache, digests)
    assert export.read_now(0, 4096) is None  # a is not here: nothing served, nothing counted
    assert (cache.counters.hits, cache.counters.misses) == (0, 0)
    assert await export.read(0, 4096) == blobs[0][:4096]  # fetched
    assert export.read_now(100, 4096) == blobs[0][100:4196]  # warm: served on the spot
    first = cache.open_fd(digests[0])
    await export.read(CHUNK, 10)
    await export.read(2 * CHUNK, 10)  # a is the oldest: evicted, its descriptor closed
    assert cache.open_fd(digests[0]) is None and first is not None
    assert names_of(first) != str(cache.path_for(digests[0]))
    assert export.read_now(0, 4096) is None
    assert await export.read(0, CHUNK) == blobs[0]  # fetched again
    assert export.read_now(CHUNK - 10, 10) == blobs[0][-10:]  # warm, from its new file
    assert cache.counters.misses == 4 and cache.open_fds <= 2


async def test_a_read_waiting_on_a_fetch_keeps_its_other_chunk_open_while_others_evict(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    digests, blobs = await put(PosixStore(root), 4)
    a, b = digests[:2]
    store = GatedStore(root, held=b)
    cache = ChunkCache(tmp_path / "cache", store, 2 * CHUNK)
    export = export_of(cache, digests)
    await export.read(0, 10)  # a cached, its file open
    fd_a = cache.open_fd(a)
    across = asyncio.create_task(export.read(CHUNK - 100, 200))  # a (cached) and b (gated)
    await asyncio.sleep(0.05)
    await export.read(2 * CHUNK, 10)  # c and d arrive while that read holds a
    await export.read(3 * CHUNK, 10)
    assert cache.open_fd(a) == fd_a and names_of(fd_a or -1) == str(cache.path_for(a))
    store.gate.set()
    assert await across == blobs[0][-100:] + blobs[1][:100]
    assert cache.cached_bytes <= 2 * CHUNK  # what the held read kept over the cap went after
    assert all(names_of(fd) is not None for fd in cache._fds.values())


async def test_the_descriptor_cap_closes_the_oldest_never_a_held_one(tmp_path: Path) -> None:
    store = PosixStore(tmp_path / "store")
    digests, blobs = await put(store, 4)
    cache = ChunkCache(tmp_path / "cache", store, 10 * CHUNK, max_fds=2)
    export = export_of(cache, digests)
    for i in range(4):
        await export.read(i * CHUNK, 10)
    with cache.hold([digests[0]]):
        fd0 = cache.open_fd(digests[0])
        for i in (1, 2, 3):
            assert export.read_now(i * CHUNK, 4096) == blobs[i][:4096]
        # three open (one held, over the cap of two), the held one among them
        assert cache.open_fd(digests[0]) == fd0 and fd0 is not None
        assert names_of(fd0) == str(cache.path_for(digests[0]))
        assert cache.open_fds <= 3
    export.read_now(CHUNK, 10)
    assert cache.open_fds == 2
    for i in range(4):  # every chunk still reads right, reopened as needed
        assert export.read_now(i * CHUNK + 5, 100) == blobs[i][5:105]


async def test_a_chunk_file_deleted_from_under_the_cache_is_fetched_again(
    tmp_path: Path,
) -> None:
    store = PosixStore(tmp_path / "store")
    digests, blobs = await put(store, 1)
    cache = ChunkCache(tmp_path / "cache", store, 10 * CHUNK)
    export = export_of(cache, digests)
    await export.read(0, 10)
    cache.close()  # no descriptor kept: the next read opens the file by name
    cache.path_for(digests[0]).unlink()
    assert export.read_now(0, 10) is None and cache.cached_chunks == 0
    assert await export.read(0, CHUNK) == blobs[0]
    assert cache.counters.misses == 2 and cache.cached_bytes == CHUNK


async def test_a_cap_the_node_lowers_is_taken_at_once_and_evicts(tmp_path: Path) -> None:
    """The node writes a new cap for the running service (`shared/blockcap.py`): it is
    taken within its check's period, and the cache comes down to it, closing the files of
    what it evicts; a held chunk stays."""
    store = PosixStore(tmp_path / "store")
    digests, _ = await put(store, 4)
    cache = ChunkCache(tmp_path / "cache", store, 10 * CHUNK)
    export = export_of(cache, digests)
    for i in range(4):
        await export.read(i * CHUNK, 10)
    assert cache.open_fds == 4
    following = asyncio.create_task(follow_cap(cache, tmp_path / "cache", every_s=0.01))
    try:
        with cache.hold([digests[0]]):
            write_cap(tmp_path / "cache", 2 * CHUNK)
            await asyncio.sleep(0.1)
            assert cache.cap_bytes == 2 * CHUNK
            # b and c went; a (the oldest, but held) and d stay
            assert cache.cached_chunks == 2 and cache.open_fd(digests[0]) is not None
        assert cache.cached_chunks == 2 and cache.cached_bytes == 2 * CHUNK
        assert cache.open_fds == 2
    finally:
        following.cancel()
