"""`ImageRepository` over every store: an image is content (images-at-scale §2, S2).

The disk is a 3 GiB sparse file with ~24 MiB of data: only its data chunks are read,
stored and written back, a download keeps at most a few chunks beside the disk, and an
image whose chunks or manifest are not what its digest says is refused with nothing left.
"""

from __future__ import annotations

import hashlib
import os
from datetime import timedelta
from pathlib import Path

import pytest

from shared.diskdigest import chunk_list
from shared.sparse import data_extents
from tests.contract.snapshot.builders import allocated
from tests.contract.snapshot.test_repository_contract import CountingStore
from workers.snapshot import (
    CorruptBlob,
    ImageFiles,
    ImageRepository,
    LayoutError,
    RetryPolicy,
    SnapshotStore,
)
from workers.snapshot.gc import collect_garbage
from workers.snapshot.images import disk_digest

MIB = 1 << 20
GIB = 1 << 30
CHUNK = 4 * MIB
RECIPE = "f" * 64


class WatchedStore(CountingStore):
    """Counts PUTs, and at every chunk GET how many chunk files already sit in the
    download's staging directory (the download must not hold the image twice)."""

    def __init__(self, inner: SnapshotStore):
        super().__init__(inner)
        self.chunk_gets = 0
        self.peak_parts = 0

    async def get_blob_to(self, digest: str, dest: Path) -> int:
        if dest.parent.name.startswith(".chunks-"):
            self.chunk_gets += 1
            self.peak_parts = max(self.peak_parts, len(list(dest.parent.iterdir())))
        return int(await self.inner.get_blob_to(digest, dest))


def sha256(path: Path) -> str:
    """sha256 of the whole file, its holes hashed as the zeros they read as without reading
    them (reading 3 GiB of holes costs seconds of kernel time on this machine)."""
    h = hashlib.sha256()
    zeros = memoryview(bytes(8 * MIB))
    fd = os.open(path, os.O_RDONLY)
    try:
        size, at = os.fstat(fd).st_size, 0
        for start, end in [*data_extents(fd, size), (size, size)]:
            for off in range(at, start, len(zeros)):
                h.update(zeros[: min(len(zeros), start - off)])
            for off in range(start, end, 8 * MIB):
                h.update(os.pread(fd, min(8 * MIB, end - off), off))
            at = end
    finally:
        os.close(fd)
    return h.hexdigest()


def make_image(directory: Path, size: int, data_at: list[int], *, zero_at: int) -> Path:
    """`root.ext4` of `size` bytes (sparse) with a random 4 MiB chunk at each offset of
    `data_at`, one allocated but all-zero chunk at `zero_at`, a kernel and an initramfs."""
    directory.mkdir(parents=True)
    disk = directory / "root.ext4"
    with disk.open("wb") as f:
        f.truncate(size)
        for offset in data_at:
            f.seek(offset)
            f.write(os.urandom(CHUNK))
        f.seek(zero_at)
        f.write(bytes(CHUNK))
    (directory / "vmlinux").write_bytes(os.urandom(MIB))
    (directory / "initrd.cpio").write_bytes(os.urandom(200 * 1024))
    return disk


def repeat_first(disk: Path, offset: int) -> None:
    """Write the disk's first chunk again at `offset` (one blob, two places)."""
    with disk.open("r+b") as f:
        data = f.read(CHUNK)
        f.seek(offset)
        f.write(data)


async def test_a_3gib_sparse_image_round_trips_and_is_sent_once(
    store: SnapshotStore, tmp_path: Path
) -> None:
    size = 3 * GIB
    src = tmp_path / "built"
    data_at = [0, 700 * MIB, 1500 * MIB, 2600 * MIB, size - CHUNK]  # 5 distinct chunks
    disk = make_image(src, size, data_at, zero_at=1 * GIB)
    repeat_first(disk, 2 * GIB)  # ~24 MiB of data in all
    expected = chunk_list(disk)
    watched = WatchedStore(store)
    repo = ImageRepository(watched)
    assert not await repo.has_image(expected.digest)

    up = await repo.upload_image(src, recipe=RECIPE, role="root", label="debian")
    m = up.manifest
    assert m.digest == expected.digest == disk_digest(m.disk)  # the node's digest is the key
    assert m.disk.chunks == expected.chunks
    assert sum(c is not None for c in m.disk.chunks) == 6  # the zero chunk is not stored
    assert len({c for c in m.disk.chunks if c is not None}) == 5
    assert len(watched.puts) == up.blobs_uploaded == 7 == len(m.blob_digests())  # + kernel, initrd
    assert await repo.has_image(m.digest) and await repo.list_images() == [m.digest]

    watched.puts.clear()
    again = await repo.upload_image(
        ImageFiles(disk, src / "vmlinux", src / "initrd.cpio"),
        recipe=RECIPE,
        role="root",
        expect_digest=expected.digest,
    )
    assert watched.puts == [] and again.blobs_uploaded == 0 and again.bytes_uploaded == 0
    assert again.manifest.digest == m.digest

    # one chunk at a time: each chunk must be gone before the next is fetched
    one_by_one = ImageRepository(watched, concurrency=1)
    got = await one_by_one.download_image(m.digest, tmp_path / "node-b" / m.digest)
    assert got.disk.name == "root.ext4" and got.manifest.digest == m.digest
    assert sha256(got.disk) == sha256(disk)
    assert allocated(got.disk) <= 1.1 * allocated(disk), "the copy lost its holes"
    assert got.kernel is not None and got.kernel.read_bytes() == (src / "vmlinux").read_bytes()
    assert got.initrd is not None and got.initrd.read_bytes() == (src / "initrd.cpio").read_bytes()
    assert sorted(p.name for p in got.dir.iterdir()) == ["initrd.cpio", "root.ext4", "vmlinux"]
    assert got.bytes_fetched == m.stored_bytes  # the repeated chunk is fetched twice
    assert watched.chunk_gets == 6 and watched.peak_parts == 0, "chunks piled up beside the disk"
    # chunks fetched 4 at a time: every one counted (a sum across awaits lost updates)
    four = await ImageRepository(store, concurrency=4).download_image(
        m.digest, tmp_path / "node-c" / m.digest
    )
    assert four.bytes_fetched == m.stored_bytes and sha256(four.disk) == sha256(disk)

    report = await collect_garbage(store, RetryPolicy(), min_age=timedelta(0))
    assert report.deleted == () and report.kept == 7  # GC keeps what an image names


async def small_image(store: SnapshotStore, tmp_path: Path) -> tuple[ImageRepository, str]:
    src = tmp_path / "built"
    make_image(src, 64 * MIB, [0, 20 * MIB, 40 * MIB], zero_at=8 * MIB)
    repo = ImageRepository(store)
    up = await repo.upload_image(src, recipe=RECIPE, role="root")
    return repo, up.manifest.digest


async def test_a_flipped_byte_in_a_chunk_fails_the_download_and_leaves_nothing(
    store: SnapshotStore, tmp_path: Path
) -> None:
    repo, digest = await small_image(store, tmp_path)
    manifest = await repo.get_image_manifest(digest)
    chunk = [c for c in manifest.disk.chunks if c is not None][-1]
    await store.get_blob_to(chunk, tmp_path / "chunk")
    bad = bytearray((tmp_path / "chunk").read_bytes())
    bad[12345] ^= 0x01
    await store.put_blob(chunk, bytes(bad))  # the store trusts the digest it is given

    dest = tmp_path / "node-b" / "image"
    with pytest.raises(CorruptBlob, match=chunk):
        await repo.download_image(digest, dest)
    assert not dest.exists()  # it made the directory: it is gone with what was in it

    dest.mkdir(parents=True)
    (dest / "other").write_text("not ours")
    with pytest.raises(CorruptBlob):
        await repo.download_image(digest, dest)
    assert [p.name for p in dest.iterdir()] == ["other"]  # no disk, no part, no kernel


async def test_a_manifest_that_is_not_its_digest_is_refused(
    store: SnapshotStore, tmp_path: Path
) -> None:
    repo, digest = await small_image(store, tmp_path)
    manifest = await repo.get_image_manifest(digest)
    chunks = list(manifest.disk.chunks)
    chunks[0], chunks[5] = chunks[5], chunks[0]  # every chunk still verifies on its own
    swapped = manifest.disk.model_copy(update={"chunks": tuple(chunks)})
    lying = manifest.model_copy(update={"disk": swapped})
    await store.put_manifest(manifest.key, lying.to_json())
    dest = tmp_path / "node-b" / "image"
    with pytest.raises(LayoutError, match=rf"image {digest}.*make up {disk_digest(swapped)}"):
        await repo.download_image(digest, dest)
    assert not dest.exists()

    # a whole, valid manifest under another image's key
    other = "0" * 64
    await store.put_manifest(f"image-{other}", manifest.to_json())
    with pytest.raises(LayoutError, match=rf"image {other}: its manifest names content {digest}"):
        await repo.download_image(other, dest)
    assert not dest.exists()


async def test_a_disk_that_changed_since_it_was_hashed_is_not_published(
    store: SnapshotStore, tmp_path: Path
) -> None:
    src = tmp_path / "built"
    disk = make_image(src, 32 * MIB, [0], zero_at=8 * MIB)
    before = chunk_list(disk).digest
    with disk.open("r+b") as f:
        f.seek(20 * MIB)
        f.write(b"late write")
    repo = ImageRepository(store)
    with pytest.raises(LayoutError, match=f"not {before}"):
        await repo.upload_image(src, recipe=RECIPE, role="root", expect_digest=before)
    assert await repo.list_images() == []
