"""Captures between this node's disk and the snapshot repository, for the host: a
template's capture (built here, pulled back when this disk lost it, or fetched when it was
captured on another node: a build's, a persistent snapshot's, an imported image's — creates
of a durable template go to any node), and paused captures of other nodes (their disk
chain rebuilt over this node's copy of the same base image). Uploads are the snapshot
worker's (`workers/snapshot/worker.py`); this is the other direction.

A capture is stacked only on the disks it was taken over, named by their content digests:
a base image or runtime disk this node lacks is fetched from the fleet's repository into
its image cache first (`ImagesByContent`: the node's `ImageSupply`, published there by
images-at-scale S5), and only if the repository lacks it too is the capture refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal, Protocol

from domain import template as tp
from workers.node.disk.produced import writing_async
from workers.node.image import ImageError, find_runtime
from workers.node.image.cache import cache_root, content_dir, entry_dir, root_disk
from workers.node.image.content import content_of, recipe_of
from workers.node.ports import CaptureRepository, HostError, Manifest, TemplateLocator
from workers.node.runtime import Runtime, Snapshot
from workers.node.templates import TemplateCatalog, TemplateError, TemplateNotLocal

__all__ = ["ImagesByContent", "Transfers"]

log = logging.getLogger(__name__)

#: The code of a capture or image this node cannot get (neither it nor the repository
#: holds the bytes): `unavailable`, not the node's failure — another node may hold them
#: (then it takes the create), and if none does the client is told 503, to try later.
NOWHERE = "unavailable"
#: what a blob written to the blob cache may allocate beyond its size (its last block)
BLOCK = 4096


class ImagesByContent(Protocol):
    """This node's image cache, filled from the repository by content (`ImageSupply`)."""

    async def by_content(self, role: Literal["root", "runtime"], digest: str) -> Path | None:
        """The cache entry holding the bytes `digest`, fetched if need be; None: nowhere."""
        ...


class Transfers:
    def __init__(
        self,
        runtime: Runtime,
        templates: TemplateCatalog,
        repository: CaptureRepository | None,
        images: ImagesByContent | None = None,
    ) -> None:
        self.runtime = runtime
        self.templates = templates
        #: where captures become durable (S3 or a shared filesystem); None: node-local only
        self.repository = repository
        #: where disks a capture names come from when this node lacks them (None: nowhere)
        self.images = images
        #: where a template this node never had is durable (the log knows; set by the worker)
        self.locate: TemplateLocator | None = None
        self._pulls: dict[str, asyncio.Lock] = {}

    async def template(self, name: str) -> Snapshot:
        """A template's capture, pulled back from the repository first if this disk lost
        it (a persistent snapshot is durable once uploaded), or fetched from there if it
        was captured on another node."""
        try:
            return await self.templates.get(name)
        except TemplateNotLocal as gone:
            return await self._pull_template(name, gone)
        except TemplateError:
            if self.templates.knows(name):  # ours, and it failed: say why
                raise
            return await self._fetch_template(name)

    async def available(self, name: str) -> Snapshot:
        """`template`, whatever fails a `HostError` (a full disk's stays `unavailable`)."""
        try:
            return await self.template(name)
        except HostError:
            raise
        except Exception as e:
            raise HostError(f"template {name!r} is not available here: {e}") from e

    async def _pull_template(self, name: str, gone: TemplateNotLocal) -> Snapshot:
        async with self._pulls.setdefault(name, asyncio.Lock()):
            try:
                return await self.templates.get(name)  # another create pulled it
            except TemplateNotLocal:
                pass
            base = gone.base_image
            if not base.is_file():  # evicted under the disk budget: its bytes by content
                manifest = await self.require("its base image is gone").get_manifest(gone.key)
                base = await self._base_image(
                    manifest.base_image.digest, manifest.base_image.content
                )
            snap = await self.fetch(
                gone.key, gone.directory, base, f"the capture of template {name!r}"
            )
            self.templates.adopt(
                name, snap, self.templates.guest_token(name), self.templates.source_of(name)
            )
            self.templates.mark_uploaded(name, snap)
            return snap

    async def _fetch_template(self, name: str) -> Snapshot:
        """A template captured on another node (a build, a persistent snapshot, an
        imported image; that node may be gone or busy): pull its durable capture over this
        node's copy of the same base bytes (`fetch_foreign`: refused over other bytes),
        and keep it as this node's from then on."""
        where = await self.locate(name) if self.locate else None
        if where is None or self.repository is None:
            raise HostError(
                f"template {name!r} is not on this node and its capture is not in "
                "the snapshot repository",
                code=NOWHERE,
            )
        key, token, source = where
        async with self._pulls.setdefault(name, asyncio.Lock()):
            try:
                return await self.templates.get(name)  # another create pulled it meanwhile
            except TemplateError:
                pass
            # a paused sandbox's capture lent to its fork children: a copy apart from the
            # sandbox's own directory of that id (its resume adopts and writes into that one)
            own = tp.is_paused_capture_template(name)
            where_to = self.runtime.snapshot_dir(name if own else key)
            snap = await self.fetch_foreign(key, f"the capture of template {name!r}", where_to)
            self.templates.adopt(name, snap, token, source)
            self.templates.mark_uploaded(name, snap)
            return snap

    def require(self, what: str) -> CaptureRepository:
        if self.repository is None:
            raise HostError(f"{what} and no snapshot repository is set")
        return self.repository

    async def fetch(
        self,
        key: str,
        directory: Path,
        base_image: Path,
        what: str,
        *,
        foreign: bool = False,
        manifest: Manifest | None = None,
    ) -> Snapshot:
        """Rebuild a capture from the repository in `directory`; the download completes
        before anything restores from it (never a half-restored VM). It is stacked only on
        the bytes it was taken over: this node's base image and runtime disk must have the
        content digests the capture recorded, or nothing is fetched and the error names
        both (`foreign`: another node's capture, refused too if it recorded none)."""
        repository = self.require(f"{what} is not on this disk")
        try:
            manifest = manifest or await repository.get_manifest(key)
            await self._runtime_disk(manifest)
            base_content, runtime_content = await asyncio.to_thread(
                _local_contents, base_image, manifest
            )
            # layers into the node's layer store: the restored VM runs on them after this
            # directory is deleted, and a later pause freezes a chain that still needs them
            layers = self.runtime.layers.root
            async with self._room(manifest, directory, layers) as counted:
                local = await repository.download(
                    key,
                    directory,
                    base_image,
                    layers_dir=layers,
                    base_content=base_content,
                    runtime_content=runtime_content,
                    foreign=foreign,
                )
                counted(local.bytes_fetched + local.blobs_fetched * BLOCK)
        except Exception as e:
            log.exception("pulling %s failed", key)
            # a full disk (`NoRoom`) stays `unavailable`: another node may have the room
            raise HostError.about(f"{what} could not be fetched", e) from e
        log.info(
            "pulled %s from the repository (%d blobs, %d bytes)",
            key,
            local.blobs_fetched,
            local.bytes_fetched,
        )
        return Snapshot.read(local.dir)

    @asynccontextmanager
    async def _room(
        self, manifest: Manifest, directory: Path, layers: Path
    ) -> AsyncIterator[Callable[[int], None]]:
        """Room under the node's disk budget for a capture's download: its blobs' bytes
        twice (the copies placed and the repository blob cache's; high, never low: a blob
        already here is counted too). Charged after: what appeared in the capture's
        directory and the layer store, plus what the download fetched into the blob cache
        (told to the callable); a download that failed is charged all it reserved."""
        budget = self.runtime.disk_budget
        if budget is None:
            yield lambda _: None
            return
        where = directory if directory.is_dir() else directory.parent
        need = 2 * manifest.stored_bytes
        async with writing_async(budget, need, [where, layers]) as r:
            try:
                yield r.charge
            except BaseException:
                r.charge(max(0, r.nbytes - r.charged))
                raise

    async def fetch_foreign(self, key: str, what: str, directory: Path | None = None) -> Snapshot:
        """A capture another node took, from the repository into this node's snapshot
        directory (`directory`; by default the capture's own), its disk chain rebuilt over
        this node's copy of the same base image (the same bytes: `fetch`)."""
        repository = self.require(f"{what} is on another node")
        try:
            manifest = await repository.get_manifest(key)
        except Exception as e:
            raise HostError(f"{what} is not in the repository: {e}") from e
        base = await self._base_image(manifest.base_image.digest, manifest.base_image.content)
        where = directory if directory is not None else self.runtime.snapshot_dir(key)
        return await self.fetch(key, where, base, what, foreign=True, manifest=manifest)

    async def _base_image(self, digest: str, content: str | None = None) -> Path:
        """This node's copy of a base image: the very bytes a capture names (its content
        digest) if this node has them or fetches them from the repository, else what the
        capture's recipe built here, else a template capture's base of that recipe. Whether
        those bytes are the capture's is `fetch`'s check (other bytes: refused, naming both)."""
        root = cache_root()
        if content and (same := content_dir(root, content)) is not None:
            return root_disk(same)  # whole, or a lazy base's stub (same bytes either way)
        if content and (fetched := await self._by_content("root", content)) is not None:
            return root_disk(fetched)
        if (entry := entry_dir(root, digest)) is not None:
            return root_disk(entry)
        for path in (c.base_image for c in self.templates.captures()):
            if path.is_file() and recipe_of(path) == digest:
                return path
        raise HostError(
            f"base image {digest[:12]} is not on this node (build the same image "
            "here: `python -m workers.node.image build-base`)",
            code=NOWHERE,
        )

    async def _runtime_disk(self, manifest: Manifest) -> None:
        """The runtime disk the capture ran with, fetched by content if this node lacks it
        (`_local_contents` and `Snapshot.read` then find it in the cache)."""
        wanted = manifest.node_manifest.get("runtime_content")
        if wanted and content_dir(cache_root(), str(wanted)) is None:
            await self._by_content("runtime", str(wanted))

    async def _by_content(self, role: Literal["root", "runtime"], digest: str) -> Path | None:
        if self.images is None:
            return None
        try:
            return await self.images.by_content(role, digest)
        except Exception as e:
            log.exception("fetching image %s failed", digest)
            raise HostError(f"image {digest} ({role}) could not be fetched: {e}") from e


def _local_contents(base_image: Path, manifest: Manifest) -> tuple[str, str | None]:
    """The content digests of this node's base image and of its runtime disk of the recipe
    the capture's node manifest names (None: not on this node; restoring then fails on it
    as before). Blocking: a disk built before digests were recorded is hashed once."""
    runtime: str | None = None
    recipe = manifest.node_manifest.get("runtime_digest")
    wanted = manifest.node_manifest.get("runtime_content")
    if wanted and (same := content_dir(cache_root(), str(wanted))) is not None:
        runtime = content_of(same / "runtime.ext4")  # the same bytes, by whatever recipe
    elif recipe:
        try:
            runtime = content_of(find_runtime(str(recipe)).path)
        except ImageError:
            runtime = None
    return content_of(base_image), runtime
