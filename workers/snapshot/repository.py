"""`SnapshotRepository`: snapshots in and out of a `SnapshotStore`, through a local cache.

Upload order is what makes a crash harmless: blobs first (each skipped if its digest is
already stored), the manifest last. A node killed mid-upload leaves only orphan blobs, and
running `upload` again sends just the ones still missing. GC removes blobs no manifest
names, sparing young ones that may belong to an upload whose manifest is not written yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal, TypeVar

from bus.failpoints import failpoint
from shared.lazybase import base_format, base_size
from workers.snapshot import chunks, diskchain, gc
from workers.snapshot.cache import BlobCache
from workers.snapshot.chunkfile import download_chunks, upload_chunks
from workers.snapshot.digest import file_digest
from workers.snapshot.errors import LayoutError
from workers.snapshot.manifest import (
    BaseImageRef,
    BlobRef,
    LayerRef,
    MemoryRef,
    SnapshotManifest,
    VolumeManifest,
)
from workers.snapshot.metrics import TransferMetrics
from workers.snapshot.nodedir import (
    LAYERS,
    MEM,
    NODE_MANIFEST,
    STATE,
    copy_file,
    parse_time,
    read_node_manifest,
    write_atomic,
)
from workers.snapshot.results import GcReport, LocalSnapshot, UploadResult
from workers.snapshot.retry import RetryPolicy, retrying
from workers.snapshot.samebytes import check_disks
from workers.snapshot.sender import BlobSender, const
from workers.snapshot.store import SnapshotStore
from workers.snapshot.tasks import gather

__all__ = ["SnapshotRepository"]

T = TypeVar("T")


class SnapshotRepository:
    """Upload, download, delete and garbage-collect snapshots in one store."""

    def __init__(
        self,
        store: SnapshotStore,
        cache: BlobCache,
        *,
        retry: RetryPolicy | None = None,
        concurrency: int = 4,
        chunk_size: int = chunks.CHUNK_SIZE,
        metrics: TransferMetrics | None = None,
    ):
        self.store = store
        self.cache = cache
        #: bytes and time of each upload and download (the node's `/metrics`)
        self.metrics = metrics or TransferMetrics()
        self.retry = retry or RetryPolicy()
        self.chunk_size = chunk_size
        # Bounds memory (one chunk per worker) and the connections a node opens to S3.
        self.concurrency = concurrency

    async def _call(self, op: Callable[[], Awaitable[T]]) -> T:
        return await retrying(op, self.retry)

    def _sender(self) -> BlobSender:
        return BlobSender(self.store, self.retry)

    async def _upload_memory(self, fd: int, path: Path, sender: BlobSender) -> MemoryRef:
        return await upload_chunks(
            fd, path, sender, chunk_size=self.chunk_size, concurrency=self.concurrency
        )

    async def _download_memory(
        self, ref: MemoryRef, dest: Path, load: Callable[[str], Awaitable[Path]]
    ) -> Path:
        return await download_chunks(ref, dest, load, concurrency=self.concurrency)

    # ---- upload ---------------------------------------------------------------------------

    async def upload(
        self,
        snapshot_dir: Path,
        layers: Sequence[Path] | None = None,
        *,
        base_image_digest: str,
        snapshot_id: str | None = None,
        parent_id: str | None = None,
    ) -> UploadResult:
        """Store the node snapshot in `snapshot_dir` (state, mem, manifest.json) and its
        disk `layers` (bottom->top; default: the chain under the manifest's `disk_top`).

        Idempotent: re-running after a crash uploads only blobs still missing. The base
        image is not uploaded; `base_image_digest` identifies it for the restoring node.
        """
        t0 = time.monotonic()
        try:
            result = await self._upload(
                snapshot_dir,
                layers,
                base_image_digest=base_image_digest,
                snapshot_id=snapshot_id,
                parent_id=parent_id,
            )
        except Exception:  # (a cancelled upload — its capture went moot — did not fail)
            self.metrics.failed("upload")
            raise
        self.metrics.moved("upload", result.bytes_uploaded, time.monotonic() - t0)
        return result

    async def _upload(
        self,
        snapshot_dir: Path,
        layers: Sequence[Path] | None,
        *,
        base_image_digest: str,
        snapshot_id: str | None,
        parent_id: str | None,
    ) -> UploadResult:
        doc = read_node_manifest(snapshot_dir)
        for name in (STATE, MEM):
            if not (snapshot_dir / name).is_file():
                raise LayoutError(f"{snapshot_dir} has no {name} file: not a complete snapshot")
        sid = snapshot_id or str(doc["snapshot_id"])
        if layers is None:
            chain, base = await asyncio.to_thread(diskchain.walk_chain, Path(doc["disk_top"]))
        else:
            chain = list(layers)
            base = await asyncio.to_thread(diskchain.check_chain, chain)
        sender = self._sender()
        mem = snapshot_dir / MEM
        fd = os.open(mem, os.O_RDONLY)  # held until the recheck, which may re-read chunks
        try:
            state_digest, state_size = await asyncio.to_thread(file_digest, snapshot_dir / STATE)
            await sender.ensure(state_digest, const(snapshot_dir / STATE))
            layer_refs = await self._upload_layers(chain, sender)
            memory = await self._upload_memory(fd, mem, sender)
            manifest = SnapshotManifest(
                snapshot_id=sid,
                parent_id=parent_id,
                created_at=parse_time(doc.get("created_at")),
                fingerprint=str(doc.get("fingerprint", "")),
                machine=dict(doc.get("machine", {})),
                base_image=BaseImageRef(
                    digest=base_image_digest,
                    size=base_size(base),  # a lazy base's stub: the image's size
                    # the bytes the layers were written over, as the capture recorded them
                    content=doc.get("base_content"),
                ),
                layers=layer_refs,
                memory=memory,
                state=BlobRef(digest=state_digest, size=state_size),
                node_manifest=doc,
            )
            failpoint("upload.before_manifest")  # (every blob sent: a crash here is mid-upload)
            await self._call(lambda: self.store.put_manifest(sid, manifest.to_json()))
            await sender.recheck_reused()
        finally:
            os.close(fd)
        return UploadResult(manifest, sender.uploaded, sender.bytes, len(sender.reused))

    async def _upload_layers(self, chain: list[Path], sender: BlobSender) -> tuple[LayerRef, ...]:
        refs: list[LayerRef] = []
        below: str | None = None
        for layer in chain:
            digest, size = await asyncio.to_thread(file_digest, layer)
            await sender.ensure(digest, const(layer))
            fmt: Literal["raw", "qcow2"] = "raw" if below is None else "qcow2"
            refs.append(
                LayerRef(digest=digest, size=size, backing_digest=below, backing_format=fmt)
            )
            below = digest
        return tuple(refs)

    async def upload_volume(self, image: Path, *, key: str, volume_id: str) -> UploadResult:
        """Store a volume's image under `key` (chunks with data, then the manifest): only
        the chunks the store lacks are sent, so a volume released again after a few writes
        costs those writes. Measured as every upload (`aenv_snapshot_transfer_*`)."""
        t0 = time.monotonic()
        sender = self._sender()
        fd = os.open(image, os.O_RDONLY)
        try:
            ref = await self._upload_memory(fd, image, sender)
            manifest = VolumeManifest(
                key=key, volume_id=volume_id, created_at=datetime.now(UTC), image=ref
            )
            await self._call(lambda: self.store.put_manifest(key, manifest.to_json()))
            await sender.recheck_reused()
        except Exception:
            self.metrics.failed("upload")
            raise
        finally:
            os.close(fd)
        self.metrics.moved("upload", sender.bytes, time.monotonic() - t0)
        return UploadResult(manifest, sender.uploaded, sender.bytes, len(sender.reused))

    async def get_volume_manifest(self, key: str) -> VolumeManifest:
        data = await self._call(lambda: self.store.get_manifest(key))
        try:
            return VolumeManifest.from_json(data)
        except ValueError as e:
            raise LayoutError(f"volume image {key}: unreadable manifest: {e}") from e

    async def download_volume(self, key: str, dest: Path) -> VolumeManifest:
        """Rebuild the volume image `key` at `dest` (sparse, written whole before it takes
        that name). Measured as every download."""
        t0 = time.monotonic()
        fetched = [0]

        async def load(digest: str) -> Path:
            async def get(path: Path) -> int:
                n = await self._call(lambda: self.store.get_blob_to(digest, path))
                fetched[0] += n
                return n

            return await self.cache.fetch(digest, get)

        try:
            manifest = await self.get_volume_manifest(key)
            with self.cache.hold(manifest.blob_digests()):
                await self._download_memory(manifest.image, dest, load)
        except Exception:
            self.metrics.failed("download")
            raise
        self.metrics.moved("download", fetched[0], time.monotonic() - t0)
        return manifest

    # ---- download -------------------------------------------------------------------------

    async def get_manifest(self, snapshot_id: str) -> SnapshotManifest:
        data = await self._call(lambda: self.store.get_manifest(snapshot_id))
        try:
            return SnapshotManifest.from_json(data)
        except ValueError as e:
            raise LayoutError(f"snapshot {snapshot_id}: unreadable manifest: {e}") from e

    async def list(self) -> list[str]:
        """Ids of every complete snapshot in the store."""
        return await self._call(self.store.list_manifests)

    async def download(
        self,
        snapshot_id: str,
        dest_dir: Path,
        base_image_path: Path,
        *,
        layers_dir: Path | None = None,
        base_content: str | None = None,
        runtime_content: str | None = None,
        foreign: bool = False,
    ) -> LocalSnapshot:
        """Rebuild snapshot `snapshot_id` in `dest_dir` over the local `base_image_path`.

        `base_content`/`runtime_content`: the content digests of this node's base image and
        runtime disk. Unless they are the ones the capture was taken over, nothing is
        fetched and `LayoutError` names both (`samebytes.check_disks`); `foreign`: the
        capture is another node's, so one that recorded no digest is refused too.

        Layout: `state`, `mem` (sparse), `layers/<digest>.qcow2` re-pointed bottom->top at
        each other and the base, and `manifest.json` written last (its presence means the
        directory is complete). Blobs already in the node cache are not fetched again.

        `layers_dir` puts the layers elsewhere: a node passes its layer store, because the
        chain must outlive this directory (a VM resumed from it runs on those layers and may
        be paused again after the snapshot directory is gone). A layer already there under
        its digest is reused as it is: a frozen layer always sits on the same chain.
        """
        t0 = time.monotonic()
        try:
            local = await self._download(
                snapshot_id,
                dest_dir,
                base_image_path,
                layers_dir,
                lambda m: check_disks(
                    m, base=base_content, runtime=runtime_content, foreign=foreign
                ),
            )
        except Exception:
            self.metrics.failed("download")
            raise
        self.metrics.moved("download", local.bytes_fetched, time.monotonic() - t0)
        return local

    async def _download(
        self,
        snapshot_id: str,
        dest_dir: Path,
        base_image_path: Path,
        layers_dir: Path | None,
        check: Callable[[SnapshotManifest], None],
    ) -> LocalSnapshot:
        manifest = await self.get_manifest(snapshot_id)
        check(manifest)  # before anything is fetched or written
        # the base's guest-visible size (a lazy base's stub: its image's, not its file's)
        size = await asyncio.to_thread(base_size, base_image_path)
        if size != manifest.base_image.size:
            raise LayoutError(
                f"snapshot {snapshot_id} needs base image {manifest.base_image.digest[:12]} "
                f"of {manifest.base_image.size} bytes; {base_image_path} has {size}"
            )
        # what the bottom layer names its base as here: the manifest says `raw` (the image's
        # bytes), this node may hold them as a raw file or as a lazy base's stub (qcow2)
        bottom_format = await asyncio.to_thread(base_format, base_image_path)
        layers_dir = layers_dir or dest_dir / LAYERS
        dest_dir.mkdir(parents=True, exist_ok=True)
        layers_dir.mkdir(parents=True, exist_ok=True)
        (dest_dir / NODE_MANIFEST).unlink(missing_ok=True)  # incomplete until rewritten
        fetched = [0, 0]

        async def load(digest: str) -> Path:
            async def get(path: Path) -> int:
                n = await self._call(lambda: self.store.get_blob_to(digest, path))
                fetched[0] += 1
                fetched[1] += n
                return n

            return await self.cache.fetch(digest, get)

        state, mem = dest_dir / STATE, dest_dir / MEM
        layers = [layers_dir / f"{ref.digest}.qcow2" for ref in manifest.layers]

        async def place(digest: str, dest: Path) -> None:
            await asyncio.to_thread(copy_file, await load(digest), dest)

        async def disk() -> None:
            # Missing layers download side by side (to a private name: a layer in a shared
            # directory may be under a running VM); re-pointing is metadata-only, bottom to
            # top, and each takes its final name only once it points at the layer below.
            todo = [
                (ref, local)
                for ref, local in zip(manifest.layers, layers, strict=True)
                if not local.exists()
            ]
            parts = {
                local: local.with_name(f"{local.name}.{os.getpid()}-{id(local)}.part")
                for _, local in todo
            }
            try:
                await gather(*(place(ref.digest, parts[local]) for ref, local in todo))
                below = base_image_path.resolve()
                for i, (ref, local) in enumerate(zip(manifest.layers, layers, strict=True)):
                    if local in parts:
                        fmt = bottom_format if i == 0 else ref.backing_format
                        await diskchain.rebase_unsafe(parts[local], below, fmt)
                        with contextlib.suppress(FileExistsError):  # placed meanwhile: same
                            os.link(parts[local], local)
                    else:
                        if i == 0 and not await asyncio.to_thread(diskchain.backed, local):
                            # its base went and came back as the other kind (a raw file,
                            # a lazy stub): nothing runs on a layer whose base is gone
                            await diskchain.rebase_unsafe(local, below, bottom_format)
                        os.utime(local)  # just used: not garbage (GC spares young layers)
                    below = local.resolve()  # qemu reads a relative backing name per image dir
            finally:
                for part in parts.values():
                    part.unlink(missing_ok=True)

        with self.cache.hold(manifest.blob_digests()):
            await gather(
                place(manifest.state.digest, state),
                disk(),
                self._download_memory(manifest.memory, mem, load),
            )

        doc = dict(manifest.node_manifest)
        doc.update(
            snapshot_id=manifest.snapshot_id,
            disk_top=str(layers[-1]),
            base_image=str(base_image_path),
        )
        await asyncio.to_thread(write_atomic, dest_dir / NODE_MANIFEST, json.dumps(doc, indent=2))
        return LocalSnapshot(
            dir=dest_dir,
            state=state,
            mem=mem,
            layers=tuple(layers),
            base_image=base_image_path,
            manifest=manifest,
            blobs_fetched=fetched[0],
            bytes_fetched=fetched[1],
        )

    # ---- delete and GC --------------------------------------------------------------------

    async def delete(self, snapshot_id: str) -> None:
        """Forget a snapshot. Its blobs stay until `collect_garbage` finds them unreferenced
        (other snapshots may share them)."""
        await self._call(lambda: self.store.delete_manifest(snapshot_id))

    async def collect_garbage(self, *, min_age: timedelta = timedelta(hours=1)) -> GcReport:
        """Delete blobs that no manifest names and that are older than `min_age`.

        `min_age` protects uploads in flight (blobs first, manifest last). An unreadable
        manifest aborts the collection rather than freeing the blobs it might name.
        """
        return await gc.collect_garbage(self.store, self.retry, min_age=min_age)
