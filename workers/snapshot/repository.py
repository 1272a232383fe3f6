"""`SnapshotRepository`: snapshots in and out of a `SnapshotStore`, through a local cache.

Upload order is what makes a crash harmless: blobs first (each skipped if its digest is
already stored), the manifest last. A node killed mid-upload leaves only orphan blobs, and
running `upload` again sends just the ones still missing. GC removes blobs no manifest
names, sparing young ones that may belong to an upload whose manifest is not written yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

from shared.sparse import data_extents
from workers.snapshot import chunks, diskchain
from workers.snapshot.cache import BlobCache
from workers.snapshot.digest import file_digest
from workers.snapshot.errors import LayoutError, ManifestNotFound
from workers.snapshot.manifest import (
    BaseImageRef,
    BlobRef,
    LayerRef,
    MemoryRef,
    SnapshotManifest,
    VolumeManifest,
    parse_manifest,
)
from workers.snapshot.metrics import TransferMetrics
from workers.snapshot.results import GcReport, LocalSnapshot, UploadResult
from workers.snapshot.retry import RetryPolicy, retrying
from workers.snapshot.store import BlobSource, SnapshotStore

T = TypeVar("T")

NODE_MANIFEST = "manifest.json"  # the node's snapshot directory layout (runtime/snapshot.py)
STATE, MEM, LAYERS = "state", "mem", "layers"


class _Sender:
    """Puts blobs that are missing, once each, and remembers which it found already there."""

    def __init__(self, repo: SnapshotRepository):
        self.repo = repo
        self.sources: dict[str, Callable[[], Awaitable[BlobSource]]] = {}
        self.reused: set[str] = set()
        self.uploaded = 0
        self.bytes = 0

    async def ensure(
        self,
        digest: str,
        source: Callable[[], Awaitable[BlobSource]],
        data: BlobSource | None = None,
    ) -> None:
        """Store `digest` unless present; `source` (re)produces its bytes, `data` if already
        at hand saves a read."""
        if digest in self.sources:  # the same bytes twice in one snapshot
            return
        self.sources[digest] = source
        if await self._has(digest):
            self.reused.add(digest)
            return
        await self._put(digest, data)

    async def _has(self, digest: str) -> bool:
        return await self.repo._call(lambda: self.repo.store.has_blob(digest))

    async def _put(self, digest: str, data: BlobSource | None) -> None:
        body = data if data is not None else await self.sources[digest]()
        await self.repo._call(lambda: self.repo.store.put_blob(digest, body))
        self.uploaded += 1
        self.bytes += len(body) if isinstance(body, bytes) else os.stat(body).st_size

    async def recheck_reused(self) -> None:
        """Re-send reused blobs a concurrent GC removed before our manifest protected them."""
        for digest in sorted(self.reused):
            if not await self._has(digest):
                await self._put(digest, None)


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
        doc = _read_node_manifest(snapshot_dir)
        for name in (STATE, MEM):
            if not (snapshot_dir / name).is_file():
                raise LayoutError(f"{snapshot_dir} has no {name} file: not a complete snapshot")
        sid = snapshot_id or str(doc["snapshot_id"])
        if layers is None:
            chain, base = await asyncio.to_thread(diskchain.walk_chain, Path(doc["disk_top"]))
        else:
            chain = list(layers)
            base = await asyncio.to_thread(diskchain.check_chain, chain)
        sender = _Sender(self)
        mem = snapshot_dir / MEM
        fd = os.open(mem, os.O_RDONLY)  # held until the recheck, which may re-read chunks
        try:
            state_digest, state_size = await asyncio.to_thread(file_digest, snapshot_dir / STATE)
            await sender.ensure(state_digest, _const(snapshot_dir / STATE))
            layer_refs = await self._upload_layers(chain, sender)
            memory = await self._upload_memory(fd, mem, sender)
            manifest = SnapshotManifest(
                snapshot_id=sid,
                parent_id=parent_id,
                created_at=_parse_time(doc.get("created_at")),
                fingerprint=str(doc.get("fingerprint", "")),
                machine=dict(doc.get("machine", {})),
                base_image=BaseImageRef(digest=base_image_digest, size=os.stat(base).st_size),
                layers=layer_refs,
                memory=memory,
                state=BlobRef(digest=state_digest, size=state_size),
                node_manifest=doc,
            )
            await self._call(lambda: self.store.put_manifest(sid, manifest.to_json()))
            await sender.recheck_reused()
        finally:
            os.close(fd)
        return UploadResult(manifest, sender.uploaded, sender.bytes, len(sender.reused))

    async def _upload_layers(self, chain: list[Path], sender: _Sender) -> tuple[LayerRef, ...]:
        refs: list[LayerRef] = []
        below: str | None = None
        for layer in chain:
            digest, size = await asyncio.to_thread(file_digest, layer)
            await sender.ensure(digest, _const(layer))
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
        sender = _Sender(self)
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

    async def _upload_memory(self, fd: int, mem: Path, sender: _Sender) -> MemoryRef:
        """Chunks with data, hashed and sent by `concurrency` workers (one chunk each in
        memory at a time); holes are never read, zero chunks never stored."""
        size = os.fstat(fd).st_size
        cs = self.chunk_size
        digests: list[str | None] = [None] * chunks.chunk_count(size, cs)
        extents = await asyncio.to_thread(data_extents, fd, size)
        todo = iter(chunks.chunks_touching(extents, cs))

        def reread(i: int) -> Callable[[], Awaitable[BlobSource]]:
            async def read() -> BlobSource:
                got = await asyncio.to_thread(chunks.read_chunk, fd, i, cs, size)
                if got is None or got[0] != digests[i]:
                    raise LayoutError(f"{mem} changed during upload (chunk {i})")
                return got[1]

            return read

        async def worker() -> None:
            for i in todo:
                got = await asyncio.to_thread(chunks.read_chunk, fd, i, cs, size)
                if got is not None:
                    digests[i] = got[0]
                    await sender.ensure(got[0], reread(i), got[1])

        await _run_workers(self.concurrency, worker)
        return MemoryRef(size=size, chunk_size=cs, chunks=tuple(digests))

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
    ) -> LocalSnapshot:
        """Rebuild snapshot `snapshot_id` in `dest_dir` over the local `base_image_path`.

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
            local = await self._download(snapshot_id, dest_dir, base_image_path, layers_dir)
        except Exception:
            self.metrics.failed("download")
            raise
        self.metrics.moved("download", local.bytes_fetched, time.monotonic() - t0)
        return local

    async def _download(
        self, snapshot_id: str, dest_dir: Path, base_image_path: Path, layers_dir: Path | None
    ) -> LocalSnapshot:
        manifest = await self.get_manifest(snapshot_id)
        base_size = os.stat(base_image_path).st_size
        if base_size != manifest.base_image.size:
            raise LayoutError(
                f"snapshot {snapshot_id} needs base image {manifest.base_image.digest[:12]} "
                f"of {manifest.base_image.size} bytes; {base_image_path} has {base_size}"
            )
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
            await asyncio.to_thread(_copy, await load(digest), dest)

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
                await _gather(*(place(ref.digest, parts[local]) for ref, local in todo))
                below = base_image_path.resolve()
                for ref, local in zip(manifest.layers, layers, strict=True):
                    if local in parts:
                        await diskchain.rebase_unsafe(parts[local], below, ref.backing_format)
                        with contextlib.suppress(FileExistsError):  # placed meanwhile: same
                            os.link(parts[local], local)
                    else:
                        os.utime(local)  # just used: not garbage (GC spares young layers)
                    below = local.resolve()  # qemu reads a relative backing name per image dir
            finally:
                for part in parts.values():
                    part.unlink(missing_ok=True)

        with self.cache.hold(manifest.blob_digests()):
            await _gather(
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
        await asyncio.to_thread(_write_atomic, dest_dir / NODE_MANIFEST, json.dumps(doc, indent=2))
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

    async def _download_memory(
        self, ref: MemoryRef, dest: Path, load: Callable[[str], Awaitable[Path]]
    ) -> Path:
        tmp = dest.with_name(dest.name + ".part")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, ref.size)  # all holes; only chunks with data get written
            todo = iter([(i, d) for i, d in enumerate(ref.chunks) if d is not None])

            async def worker() -> None:
                for i, digest in todo:
                    blob = await load(digest)
                    await asyncio.to_thread(_place_chunk, fd, i * ref.chunk_size, blob)

            await _run_workers(self.concurrency, worker)
            await asyncio.to_thread(os.fsync, fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        os.replace(tmp, dest)
        return dest

    # ---- delete and GC --------------------------------------------------------------------

    async def delete(self, snapshot_id: str) -> None:
        """Forget a snapshot. Its blobs stay until `collect_garbage` finds them unreferenced
        (other snapshots may share them)."""
        await self._call(lambda: self.store.delete_manifest(snapshot_id))

    async def _referenced(self, ids: Sequence[str]) -> set[str]:
        live: set[str] = set()
        for sid in ids:
            try:
                data = await self._call(functools.partial(self.store.get_manifest, sid))
            except ManifestNotFound:  # deleted while we listed: its blobs are fair game
                continue
            try:
                live |= parse_manifest(data).blob_digests()
            except ValueError as e:
                raise LayoutError(f"snapshot {sid}: unreadable manifest: {e}") from e
        return live

    async def collect_garbage(self, *, min_age: timedelta = timedelta(hours=1)) -> GcReport:
        """Delete blobs that no manifest names and that are older than `min_age`.

        `min_age` protects uploads in flight (blobs first, manifest last). An unreadable
        manifest aborts the collection rather than freeing the blobs it might name.
        """
        ids = await self.list()
        live = await self._referenced(ids)
        cutoff = datetime.now(UTC) - min_age
        candidates: dict[str, int] = {}
        kept = young = 0
        async for blob in self.store.iter_blobs():
            if blob.digest in live:
                kept += 1
            elif blob.modified > cutoff:
                young += 1
            else:
                candidates[blob.digest] = blob.size
        # Manifests written while we listed blobs may name some candidates: look again.
        newer = sorted(set(await self.list()) - set(ids))
        for digest in await self._referenced(newer):
            if candidates.pop(digest, None) is not None:
                kept += 1
        for digest in candidates:
            await self._call(functools.partial(self.store.delete_blob, digest))
        return GcReport(tuple(sorted(candidates)), sum(candidates.values()), kept, young)


async def _run_workers(n: int, worker: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run `n` copies of `worker`; the first failure cancels the rest and is re-raised
    as itself (callers handle `StoreError`, not an ExceptionGroup)."""
    await _gather(*(worker() for _ in range(n)))


async def _gather(*coros: Coroutine[Any, Any, Any]) -> None:
    """Run `coros` together; the first failure cancels the rest and is re-raised as itself."""
    try:
        async with asyncio.TaskGroup() as tg:
            for c in coros:
                tg.create_task(c)
    except BaseExceptionGroup as eg:
        raise eg.exceptions[0] from None


def _const(source: BlobSource) -> Callable[[], Awaitable[BlobSource]]:
    async def get() -> BlobSource:
        return source

    return get


def _read_node_manifest(snapshot_dir: Path) -> dict[str, Any]:
    try:
        doc = json.loads((snapshot_dir / NODE_MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise LayoutError(f"{snapshot_dir}: no readable {NODE_MANIFEST}: {e}") from e
    if not isinstance(doc, dict) or "snapshot_id" not in doc:
        raise LayoutError(f"{snapshot_dir}/{NODE_MANIFEST} is not a node snapshot manifest")
    return doc


def _parse_time(value: object) -> datetime:
    if isinstance(value, str) and value:
        try:
            t = datetime.fromisoformat(value)
            return t if t.tzinfo else t.replace(tzinfo=UTC)
        except ValueError:
            pass
    return datetime.now(UTC)


def _copy(src: Path, dest: Path) -> None:
    tmp = dest.with_name(dest.name + ".part")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


def _write_atomic(dest: Path, text: str) -> None:
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, dest)


def _place_chunk(fd: int, offset: int, blob: Path) -> None:
    chunks.write_sparse(fd, offset, blob.read_bytes())
