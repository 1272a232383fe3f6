"""`ImageRepository`: guest disk images as content in the snapshot store (images-at-scale §2).

Two builds of one recipe give different ext4 bytes, so the fleet builds an image once and
every other node fetches those bytes. An image is stored as its raw sparse disk cut in
chunks (zero chunks never stored, holes never read), its kernel and initramfs as blobs,
and an `ImageManifest` named by the disk's content digest, written last: a present
manifest means every blob it names is stored. A second upload of the same image sends no
blob (each is looked up first).

A download bypasses the node's `BlobCache`: an image is large, the node keeps it whole
in its image cache, and a second copy of every chunk in the blob cache would hold it twice.
Each chunk lands in a private file, is verified and placed into the sparse disk, then
removed, so at most `concurrency` chunks exist beside the disk. The content digest is then
recomputed from the chunk digests this download verified and must be the one asked for.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from shared import diskdigest
from workers.snapshot import chunks, paths
from workers.snapshot.chunkfile import download_chunks, upload_chunks
from workers.snapshot.digest import file_digest
from workers.snapshot.errors import CorruptBlob, LayoutError, ManifestNotFound
from workers.snapshot.manifest import BlobRef, ImageManifest, MemoryRef, TraceManifest
from workers.snapshot.metrics import TransferMetrics
from workers.snapshot.results import ImageUpload, LocalImage
from workers.snapshot.retry import RetryPolicy, retrying
from workers.snapshot.sender import BlobSender, const
from workers.snapshot.store import SnapshotStore

__all__ = ["INITRD", "KERNEL", "ImageFiles", "ImageRepository", "Role", "disk_digest", "disk_name"]

T = TypeVar("T")
Role = Literal["root", "runtime"]

#: File names in an image directory, as the node's image cache lays them out
#: (`<digest>/{root.ext4,vmlinux,initrd.cpio}`, `runtime-<digest>/runtime.ext4`).
KERNEL = "vmlinux"
INITRD = "initrd.cpio"


def disk_name(role: Role) -> str:
    return "root.ext4" if role == "root" else "runtime.ext4"


def disk_digest(ref: MemoryRef) -> str:
    """The content digest of the disk `ref` lists: `shared.diskdigest.chunk_list(file).digest`
    of the file it was cut from (the same chunking, the same canonical form)."""
    return diskdigest.disk_digest(ref.size, ref.chunk_size, ref.chunks)


@dataclass(frozen=True)
class ImageFiles:
    """The files of one image: the disk, and for a root image the kernel and initramfs."""

    disk: Path
    kernel: Path | None = None
    initrd: Path | None = None

    @classmethod
    def in_dir(cls, directory: Path, role: Role) -> ImageFiles:
        disk = directory / disk_name(role)
        if not disk.is_file():
            raise LayoutError(f"{directory} has no {disk.name}: not an image directory")
        kernel, initrd = directory / KERNEL, directory / INITRD
        return cls(disk, kernel if kernel.is_file() else None, initrd if initrd.is_file() else None)


class ImageRepository:
    """Upload, download and look up disk images in one store."""

    def __init__(
        self,
        store: SnapshotStore,
        *,
        retry: RetryPolicy | None = None,
        concurrency: int = 4,
        chunk_size: int = chunks.CHUNK_SIZE,
        metrics: TransferMetrics | None = None,
    ):
        self.store = store
        self.retry = retry or RetryPolicy()
        # Bounds memory (one chunk per worker), the connections to S3, and the chunks that
        # sit beside a disk being downloaded.
        self.concurrency = concurrency
        self.chunk_size = chunk_size
        self.metrics = metrics or TransferMetrics()

    async def _call(self, op: Callable[[], Awaitable[T]]) -> T:
        return await retrying(op, self.retry)

    # ---- upload ---------------------------------------------------------------------------

    async def upload_image(
        self,
        source: Path | ImageFiles,
        *,
        recipe: str,
        role: Role,
        label: str = "",
        expect_digest: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> ImageUpload:
        """Store the image in `source` (a directory laid out as the node's image cache, or
        its files), blobs first and the manifest last; returns what had to be sent.
        `expect_digest`: the content digest the builder computed; a disk whose bytes no
        longer give it was changed since, and is refused before its manifest is written."""
        t0 = time.monotonic()
        files = source if isinstance(source, ImageFiles) else ImageFiles.in_dir(source, role)
        sender = BlobSender(self.store, self.retry)
        fd = os.open(files.disk, os.O_RDONLY)  # held until the recheck, which may re-read
        try:
            disk = await upload_chunks(
                fd, files.disk, sender, chunk_size=self.chunk_size, concurrency=self.concurrency
            )
            digest = disk_digest(disk)
            if expect_digest is not None and digest != expect_digest:
                raise LayoutError(
                    f"{files.disk} has content digest {digest}, not {expect_digest}: "
                    "it changed after it was hashed"
                )
            manifest = ImageManifest(
                digest=digest,
                role=role,
                recipe=recipe,
                label=label,
                created_at=datetime.now(UTC),
                disk=disk,
                kernel=await _send_file(files.kernel, sender),
                initrd=await _send_file(files.initrd, sender),
                meta=meta,
            )
            await self._call(lambda: self.store.put_manifest(manifest.key, manifest.to_json()))
            await sender.recheck_reused()
        except Exception:
            self.metrics.failed("upload")
            raise
        finally:
            os.close(fd)
        self.metrics.moved("upload", sender.bytes, time.monotonic() - t0)
        return ImageUpload(manifest, sender.uploaded, sender.bytes, len(sender.reused))

    # ---- look up --------------------------------------------------------------------------

    async def has_image(self, digest: str) -> bool:
        """Whether the image is stored whole (its manifest is written only after its blobs)."""
        try:
            await self._call(lambda: self.store.get_manifest(paths.image_key(digest)))
        except ManifestNotFound:
            return False
        return True

    async def list_images(self) -> list[str]:
        """Content digests of every stored image, sorted."""
        ids = await self._call(self.store.list_manifests)
        return sorted(d for d in map(paths.image_digest_from_id, ids) if d is not None)

    async def get_image_manifest(self, digest: str) -> ImageManifest:
        data = await self._call(lambda: self.store.get_manifest(paths.image_key(digest)))
        try:
            return ImageManifest.from_json(data)
        except ValueError as e:
            raise LayoutError(f"image {digest}: unreadable manifest: {e}") from e

    async def get_trace(self, digest: str) -> TraceManifest | None:
        """The image's read trace (the block service's prefetch list), None if none is
        stored. Raises `LayoutError` for one it cannot read."""
        try:
            data = await self._call(lambda: self.store.get_manifest(paths.trace_key(digest)))
        except ManifestNotFound:
            return None
        try:
            return TraceManifest.from_json(data)
        except ValueError as e:
            raise LayoutError(f"image {digest}: unreadable trace: {e}") from e

    async def put_trace(self, trace: TraceManifest) -> None:
        """Store (or replace: two nodes' recordings, the last one wins) an image's trace."""
        await self._call(lambda: self.store.put_manifest(trace.key, trace.to_json()))

    # ---- download -------------------------------------------------------------------------

    async def download_image(
        self, digest: str, dest_dir: Path, *, with_disk: bool = True
    ) -> LocalImage:
        """Rebuild image `digest` in `dest_dir` (`disk_name(role)`, `vmlinux`, `initrd.cpio`),
        the disk as sparse as it was uploaded. Raises `CorruptBlob` for a chunk whose bytes
        are not its digest and `LayoutError` when the chunks do not make up `digest`; on any
        failure the files this call wrote are removed (and `dest_dir`, if it made it).
        `with_disk=False`: the kernel and initramfs only (a node that reads the disk's
        blocks lazily through its block service, issue 29); the result's `disk` is absent."""
        t0 = time.monotonic()
        fetched = [0]
        made_dir = not dest_dir.exists()
        written: list[Path] = []
        try:
            manifest = await self.get_image_manifest(digest)
            _check_names(manifest, digest)  # a manifest that lies is refused before fetching
            dest_dir.mkdir(parents=True, exist_ok=True)
            kernel = await self._fetch_file(manifest.kernel, dest_dir / KERNEL, written, fetched)
            initrd = await self._fetch_file(manifest.initrd, dest_dir / INITRD, written, fetched)
            disk = dest_dir / disk_name(manifest.role)
            if with_disk:
                await self._fetch_disk(manifest, disk, written, fetched)
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            if made_dir:
                shutil.rmtree(dest_dir, ignore_errors=True)
            self.metrics.failed("download")
            raise
        self.metrics.moved("download", fetched[0], time.monotonic() - t0)
        return LocalImage(dest_dir, disk, kernel, initrd, manifest, fetched[0])

    async def _fetch_file(
        self, ref: BlobRef | None, dest: Path, written: list[Path], fetched: list[int]
    ) -> Path | None:
        if ref is None:
            return None
        # get_blob_to writes beside `dest` and renames only a verified blob into place
        # the await first, then the sum: `x[0] += await f()` reads x[0] before it awaits,
        # and concurrent loads would each write back a stale total
        got = await self._call(lambda: self.store.get_blob_to(ref.digest, dest))
        fetched[0] += got
        written.append(dest)
        return dest

    async def _fetch_disk(
        self, manifest: ImageManifest, disk: Path, written: list[Path], fetched: list[int]
    ) -> None:
        staging = Path(tempfile.mkdtemp(prefix=".chunks-", dir=disk.parent))
        names = itertools.count()
        verified: dict[str, str] = {}  # chunk digest -> sha256 of the bytes placed for it

        async def load(chunk: str) -> Path:
            part = staging / f"{next(names)}.part"  # one chunk may recur: a name per load
            n = await self._call(lambda: self.store.get_blob_to(chunk, part))
            fetched[0] += n  # after the await (see `_fetch_file`): chunks load concurrently
            got, _ = await asyncio.to_thread(file_digest, part)
            if got != chunk:  # the store verifies too; this download answers for itself
                part.unlink(missing_ok=True)
                raise CorruptBlob(f"image {manifest.digest}: chunk {chunk} arrived as {got}")
            verified[chunk] = got
            return part

        try:
            await download_chunks(
                manifest.disk, disk, load, concurrency=self.concurrency, discard=True
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        written.append(disk)
        ref = manifest.disk
        placed = tuple(None if c is None else verified.get(c) for c in ref.chunks)
        got = diskdigest.disk_digest(ref.size, ref.chunk_size, placed)
        if got != manifest.digest:
            raise LayoutError(
                f"image {manifest.digest}: the downloaded chunks make up {got}; refusing it"
            )


async def _send_file(path: Path | None, sender: BlobSender) -> BlobRef | None:
    if path is None:
        return None
    digest, size = await asyncio.to_thread(file_digest, path)
    await sender.ensure(digest, const(path))
    return BlobRef(digest=digest, size=size)


def _check_names(manifest: ImageManifest, digest: str) -> None:
    """The manifest under `image-<digest>` must describe exactly those bytes."""
    listed = disk_digest(manifest.disk)
    if manifest.digest != digest or listed != digest:
        raise LayoutError(
            f"image {digest}: its manifest names content {manifest.digest} and lists "
            f"chunks that make up {listed}; refusing it"
        )
