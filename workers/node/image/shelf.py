"""`CacheShelf`: this node's image cache as S5's `ImageShelf`, filled from the snapshot
repository (images-at-scale S5), and the build side of the one build per fleet.

- `held(recipe)`: the cache's `recipes/` entry (`cache.entry_dir`), named by its content;
- `fetch(recipe, digest)`: the published bytes downloaded into a `cache.staging` dir under
  the recipe's lock (the lock a local build of it takes too), completed with the builder's
  `manifest.json` and published by `cache.publish_content` (which links `recipes/<recipe>`).
  A failed or corrupt download leaves no entry (`download_image` removes its files, and
  `staging` its directory);
- `build(recipe, make)`: the local build (`make`, in a thread: debootstrap, layers, mkfs),
  then its disk (+ kernel and initramfs for a root image) uploaded as `image-<content>`.

How a fetching node gets the recipe-specific facts of the entry (guest defaults, kernel,
`kernel_cmdline_base`, recipe digest): the builder's `manifest.json` rides in the
repository's `ImageManifest.meta`, minus its `content` section; the fetcher writes it back
with `content` rebuilt from the verified chunk list it downloaded and its own copy's stamp
(so `content.recorded_content` trusts it), plus a `fetched` note. `GuestImage.load` and
`RuntimeDisk.load` then read the entry as they read one built here.

The repository is a port (`ImageStorage`, `workers.snapshot.ImageRepository` satisfies it):
node workers do not import the snapshot worker's package.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from workers.node.disk.budget import DiskBudget
from workers.node.disk.produced import writing_async
from workers.node.disk.usage import allocated

from . import cache as _cache
from .content import content_of, disk_stamp
from .errors import ImageError
from .fleet import BuiltImage
from .lazy import LazyImages, make_lazy_entry

__all__ = ["CacheShelf", "ImageStorage", "disk_file"]

log = logging.getLogger(__name__)

Role = Literal["root", "runtime"]
#: What a fetch writes beside the disk's stored chunks: kernel, initramfs, chunks in flight
FETCH_EXTRA = 64 << 20
#: A progress line at most this often while a fetch runs (a base image: ~600 MiB).
PROGRESS_EVERY_S = 10.0


def disk_file(role: Role) -> str:
    """The disk's name in a cache entry (the repository names it the same)."""
    return "root.ext4" if role == "root" else "runtime.ext4"


class _ChunkList(Protocol):
    @property
    def size(self) -> int: ...

    @property
    def chunk_size(self) -> int: ...

    @property
    def chunks(self) -> Sequence[str | None]: ...


class _Stored(Protocol):
    """A stored image's manifest, as far as the shelf reads it."""

    @property
    def digest(self) -> str: ...

    @property
    def stored_bytes(self) -> int: ...

    @property
    def disk(self) -> _ChunkList: ...

    @property
    def meta(self) -> dict[str, Any] | None: ...


class _Uploaded(Protocol):
    @property
    def manifest(self) -> _Stored: ...


class _Downloaded(Protocol):
    @property
    def manifest(self) -> _Stored: ...

    @property
    def disk(self) -> Path: ...

    @property
    def bytes_fetched(self) -> int: ...


class ImageStorage(Protocol):
    """What the shelf needs of the repository (`ImageRepository`)."""

    async def upload_image(
        self,
        source: Path,
        *,
        recipe: str,
        role: Role,
        label: str = "",
        expect_digest: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> _Uploaded: ...

    async def download_image(
        self, digest: str, dest_dir: Path, *, with_disk: bool = True
    ) -> _Downloaded: ...

    async def has_image(self, digest: str) -> bool: ...

    async def get_image_manifest(self, digest: str) -> _Stored: ...


def _nothing(_bytes: int, _seconds: float) -> None:
    return None


class CacheShelf:
    """One role's images (root or runtime) in one cache root, and the repository."""

    def __init__(
        self,
        root: Path,
        storage: ImageStorage,
        role: Role,
        *,
        progress: Callable[[str], None] = log.info,
        on_fetched: Callable[[int, float], None] = _nothing,
        budget: DiskBudget | None = None,
        lazy: LazyImages | None = None,
    ) -> None:
        self.root = root
        #: root images wanted by content are held lazily over this block service (issue 29)
        self.lazy = lazy if role == "root" else None
        #: the node's disk budget: a fetch reserves the image's stored bytes first
        self.budget = budget
        self.storage = storage
        self.role: Role = role
        self.progress = progress
        #: (bytes fetched, seconds): the node's metrics
        self.on_fetched = on_fetched

    def key(self, recipe: str) -> str:
        """The recipe's name in the cache (`recipes/<key>`, the lock's key)."""
        return recipe if self.role == "root" else f"runtime-{recipe}"

    def held(self, recipe: str) -> str | None:
        d = _cache.entry_dir(self.root, self.key(recipe))
        if d is None:
            return None
        # recorded at build or fetch; an entry from before content digests is hashed once
        return content_of(d / disk_file(self.role))

    async def fetch(self, recipe: str, digest: str) -> None:
        key = self.key(recipe)
        t0 = time.monotonic()
        async with _locked(self.root, key):
            if self.held(recipe) is not None:  # another task of this node fetched it
                return
            async with self._reserved(digest):
                with _cache.staging(self.root, key) as tmp:
                    async with self._reporting(digest, tmp):
                        got = await self.storage.download_image(digest, tmp)
                    await asyncio.to_thread(self._complete, tmp, recipe, got)
                    _cache.publish_content(self.root, tmp, key, digest)
        seconds = time.monotonic() - t0
        self.on_fetched(got.bytes_fetched, seconds)
        self.progress(
            f"image {digest[:12]} ({self.role}, recipe {recipe[:12]}): fetched "
            f"{got.bytes_fetched >> 20} MiB in {seconds:.1f}s"
        )

    async def fetch_content(self, digest: str) -> Path | None:
        """The cache entry holding exactly the bytes `digest` (`images/<digest>`), fetched
        from the repository if this node lacks them; None if the repository lacks them too.

        For a capture taken over bytes this node never had (another node's build of the
        recipe, a recipe of another envd or size): its layers are valid only over those
        bytes, so they are fetched by content. A recipe this node already holds keeps its
        own entry (its templates and new VMs run on that); one it lacks is linked to these.
        With `lazy` (a root image, `AENV_LAZY_IMAGES=on`) the disk is not downloaded: the
        entry holds a stub over the node's block service (`lazy.py`), and no recipe link."""
        if (held := _cache.content_dir(self.root, digest)) is not None:
            return held
        if not await self.storage.has_image(digest):
            return None
        key = f"content-{digest}"  # `cache.lock_of` an `images/` entry
        t0 = time.monotonic()
        async with _locked(self.root, key):
            if (held := _cache.content_dir(self.root, digest)) is not None:
                return held  # another task of this node fetched it
            if self.lazy is not None:
                return await self._lazy_entry(digest, key, self.lazy, t0)
            async with self._reserved(digest):
                with _cache.staging(self.root, key) as tmp:
                    async with self._reporting(digest, tmp):
                        got = await self.storage.download_image(digest, tmp)
                    if not (tmp / disk_file(self.role)).is_file():
                        raise ImageError(f"image {digest} is not a {self.role} image")
                    recipe = str((got.manifest.meta or {}).get("digest", ""))
                    await asyncio.to_thread(self._complete, tmp, recipe, got)
                    link = (
                        self.key(recipe)
                        if _cache.entry_dir(self.root, self.key(recipe)) is None
                        else None
                    )
                    final = _cache.publish_content(self.root, tmp, link, digest)
        seconds = time.monotonic() - t0
        self.on_fetched(got.bytes_fetched, seconds)
        self.progress(
            f"image {digest[:12]} ({self.role}, by content): fetched "
            f"{got.bytes_fetched >> 20} MiB in {seconds:.1f}s"
        )
        return final

    async def _lazy_entry(self, digest: str, key: str, lazy: LazyImages, t0: float) -> Path:
        """`images/<digest>` held lazily (`lazy.py`): the kernel and initramfs fetched, the
        disk a stub over the block service. Under the disk budget: those files only."""
        stored = await self.storage.get_image_manifest(digest)
        if stored.meta is None:
            raise ImageError(f"image {digest} was stored without its builder's manifest")
        async with self._reserved(digest, lazy=True):
            with _cache.staging(self.root, key) as tmp:
                got = await self.storage.download_image(digest, tmp, with_disk=False)
                disk = stored.disk
                await asyncio.to_thread(
                    make_lazy_entry,
                    tmp,
                    lazy,
                    digest=digest,
                    size=disk.size,
                    chunk_size=disk.chunk_size,
                    chunks=list(disk.chunks),
                    meta=stored.meta,
                )
                final = _cache.publish_content(self.root, tmp, None, digest)
        seconds = time.monotonic() - t0
        self.on_fetched(got.bytes_fetched, seconds)
        self.progress(
            f"image {digest[:12]} ({self.role}, by content): held lazily over "
            f"{lazy.socket} ({got.bytes_fetched >> 20} MiB of kernel and initramfs "
            f"fetched in {seconds:.1f}s, {stored.stored_bytes >> 20} MiB of disk on demand)"
        )
        return final

    @contextlib.asynccontextmanager
    async def _reserved(self, digest: str, *, lazy: bool = False) -> AsyncIterator[None]:
        """Room for the image's bytes under the disk budget (`NoRoom` if it cannot fit),
        what the fetch published charged after."""
        if self.budget is None:
            yield
            return
        stored = await self.storage.get_image_manifest(digest)
        need = (0 if lazy else stored.stored_bytes) + FETCH_EXTRA
        async with writing_async(self.budget, need, [self.root / _cache.IMAGES]):
            yield

    def _complete(self, tmp: Path, recipe: str, got: _Downloaded) -> None:
        """Write the entry's `manifest.json`: the builder's, with `content` for these bytes."""
        stored = got.manifest
        meta = stored.meta
        if meta is None:
            raise ImageError(
                f"image {stored.digest} was stored without its builder's manifest "
                "(an upload older than S5): this node cannot use it; build it here"
            )
        if meta.get("digest") != recipe:
            raise ImageError(
                f"image {stored.digest} was built from recipe {meta.get('digest')}, "
                f"not {recipe}: refusing it"
            )
        disk = stored.disk
        doc = {
            **meta,
            "content": {
                "digest": stored.digest,
                "size": disk.size,
                "chunk_size": disk.chunk_size,
                "chunks": list(disk.chunks),
                "stamp": disk_stamp(got.disk),  # kept by the publishing rename
            },
            "fetched": {
                "bytes": got.bytes_fetched,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
        }
        (tmp / _cache.MANIFEST).write_text(json.dumps(doc, indent=2) + "\n")

    @contextlib.asynccontextmanager
    async def _reporting(self, digest: str, tmp: Path) -> AsyncIterator[None]:
        """Progress lines while a long download runs: what has landed in `tmp` so far."""
        t0 = time.monotonic()

        async def report() -> None:
            while True:
                await asyncio.sleep(PROGRESS_EVERY_S)
                landed = await asyncio.to_thread(allocated, tmp)
                self.progress(
                    f"image {digest[:12]}: {landed >> 20} MiB fetched "
                    f"({time.monotonic() - t0:.0f}s)"
                )

        task = asyncio.create_task(report())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def build(self, recipe: str, make: Callable[[], Path], *, label: str = "") -> BuiltImage:
        """Build here (`make` returns the cache entry it published, run in a thread) and
        upload it; what `FleetImages` publishes."""
        entry = await asyncio.to_thread(make)
        meta = json.loads((entry / _cache.MANIFEST).read_text())
        content = (meta.pop("content", None) or {}).get("digest")
        if content is None:  # an entry from before content digests
            content = await asyncio.to_thread(content_of, entry / disk_file(self.role))
        uploaded = await self.storage.upload_image(
            entry,
            recipe=recipe,
            role=self.role,
            label=label,
            expect_digest=content,
            meta=meta,
        )
        stored = uploaded.manifest
        return BuiltImage(stored.digest, stored.stored_bytes, stored.disk.size)


@contextlib.asynccontextmanager
async def _locked(root: Path, key: str) -> AsyncIterator[None]:
    """`cache.locked` from the event loop: the flock is waited for in a thread (a build of
    the recipe by another thread or process may hold it for minutes)."""
    stack = contextlib.ExitStack()
    taking = asyncio.ensure_future(asyncio.to_thread(stack.enter_context, _cache.locked(root, key)))
    try:
        await asyncio.shield(taking)
    except asyncio.CancelledError:  # the thread still takes it: let it go once it has
        taking.add_done_callback(lambda _: stack.close())
        raise
    try:
        yield
    finally:
        stack.close()
