"""`ImageSupply`: how this node gets the images it runs — the base image, envd's runtime
disk, the code-interpreter image (images-at-scale S5).

With a repository (`Fleet`), each image is built once per fleet: its recipe digest is
computed from the inputs first (nothing built), `FleetImages.ensure` finds it in this
node's cache, fetches the published bytes, or wins the claim and builds and uploads it
(`CacheShelf`). Only the claim's winner debootstraps or unpacks layers. Then the local
builder is called as before and finds the entry in the cache, so callers get the same
`GuestImage`/`RuntimeDisk` (and `names/` links) whichever way the bytes came.
Without a repository, the images are built here as they always were.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bus.store import ImageStore
from domain import image as im
from workers.node.disk.budget import DiskBudget

from . import cache as _cache
from .build import GuestImage, base_recipe, build_base, name_image, oci_recipe
from .codeint import build_code_interpreter, code_interpreter_recipe
from .fleet import FleetImages
from .lazy import LazyImages
from .runtime import RuntimeDisk, build_runtime, runtime_recipe
from .shelf import CacheShelf, ImageStorage, Role

__all__ = ["Fleet", "ImageSupply"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def _no_fetch(_bytes: int, _seconds: float) -> None:
    return None


def _no_build(_label: str) -> None:
    return None


@dataclass(frozen=True)
class Fleet:
    """The fleet's side of images: the log that decides who builds, the repository that
    holds the bytes, and this node's name and metrics."""

    store: ImageStore
    storage: ImageStorage
    node_id: str
    #: (bytes, seconds) of each fetch
    on_fetched: Callable[[int, float], None] = _no_fetch
    #: each image this node builds for the fleet (its label: base, runtime, ...)
    on_built: Callable[[str], None] = _no_build
    lease_s: int = im.DEFAULT_LEASE_S


class ImageSupply:
    """This node's images, from its cache, the fleet's repository, or its own build."""

    def __init__(
        self,
        cache: Path | None = None,
        *,
        fleet: Fleet | None = None,
        progress: Callable[[str], None] = log.info,
        budget: DiskBudget | None = None,
        lazy: LazyImages | None = None,
    ) -> None:
        self.root = _cache.cache_root(cache)
        #: the node's disk budget: what an import reserves before it writes (None: none)
        self.budget = budget
        self.progress = progress
        self._fleet = fleet
        self._images: dict[Role, tuple[FleetImages, CacheShelf]] = {}
        if fleet is not None:
            for role in ("root", "runtime"):
                shelf = CacheShelf(
                    self.root,
                    fleet.storage,
                    role,
                    progress=progress,
                    on_fetched=fleet.on_fetched,
                    budget=budget,
                    lazy=lazy,
                )
                images = FleetImages(fleet.store, shelf, fleet.node_id, lease_s=fleet.lease_s)
                self._images[role] = (images, shelf)

    async def base(self, free_bytes: int) -> GuestImage:
        """The default Debian image (`build_base`)."""
        p = self.progress
        return await self._get(
            "root",
            "base",
            functools.partial(base_recipe, self.root, progress=p, free_bytes=free_bytes),
            functools.partial(build_base, self.root, progress=p, free_bytes=free_bytes),
            lambda img: img.rootfs.parent,
        )

    async def code_interpreter(self, free_bytes: int) -> GuestImage:
        """The code-interpreter image (`build_code_interpreter`)."""
        p = self.progress
        return await self._get(
            "root",
            "code-interpreter",
            functools.partial(
                code_interpreter_recipe, self.root, progress=p, free_bytes=free_bytes
            ),
            functools.partial(build_code_interpreter, self.root, progress=p, free_bytes=free_bytes),
            lambda img: img.rootfs.parent,
        )

    async def runtime(self) -> RuntimeDisk:
        """envd's runtime disk for this envd (`build_runtime`)."""
        return await self._get(
            "runtime",
            "runtime",
            runtime_recipe,
            functools.partial(build_runtime, self.root, progress=self.progress),
            lambda disk: disk.path.parent,
        )

    async def by_content(self, role: Role, digest: str) -> Path | None:
        """The cache entry holding the bytes `digest` (a capture names the disks it was
        taken over), fetched from the fleet's repository if this node lacks it
        (`CacheShelf.fetch_content`; a root image lazily when the supply was given `lazy`:
        its disk a stub over the block service); None: neither has it, or there is no
        repository."""
        if self._fleet is None:
            return _cache.content_dir(self.root, digest)
        return await self._images[role][1].fetch_content(digest)

    @property
    def fleet_wide(self) -> bool:
        """Whether images come from the fleet (a repository) rather than a local build."""
        return self._fleet is not None

    async def oci_import(
        self,
        manifest: str,
        name: str,
        free_bytes: int,
        build: Callable[[], GuestImage],
        *,
        progress: Callable[[str], None] | None = None,
    ) -> GuestImage:
        """An image imported from a registry (`imports.py`), named by its manifest digest
        (`oci_recipe`, no layer pulled): `build` (pull, unpack, mkfs) runs only on the node
        that wins the recipe's claim; any other fetches its bytes. Recorded as `name`.
        `progress` (the import's build log) hears the recipe's steps; a fetch's lines go to
        the node's log."""
        p = _both(self.progress, progress)
        recipe_of = functools.partial(
            oci_recipe, manifest, self.root, progress=p, free_bytes=free_bytes
        )
        found = functools.partial(name_image, cache=self.root)
        return await self._get(
            "root",
            "import",
            recipe_of,
            build,
            lambda img: img.rootfs.parent,
            found=lambda recipe: found(recipe, name),
        )

    async def _get(
        self,
        role: Role,
        label: str,
        recipe_of: Callable[[], str],
        build: Callable[[], T],
        entry_of: Callable[[T], Path],
        *,
        found: Callable[[str], T] | None = None,
    ) -> T:
        """`build`'s result, its bytes fetched or built once per fleet first. `found`
        reads the entry once it is in the cache (default: `build`, which finds it)."""
        if self._fleet is None:
            return await asyncio.to_thread(build)
        images, shelf = self._images[role]
        on_built = self._fleet.on_built
        recipe = await asyncio.to_thread(recipe_of)
        find = found or (lambda _: build())  # in the cache: found, not built

        def make() -> Path:
            on_built(label)
            return entry_of(build())

        def held() -> Path:
            return entry_of(find(recipe))

        await images.ensure(
            recipe,
            role,
            lambda: shelf.build(recipe, make, label=label),
            share=lambda: shelf.build(recipe, held, label=label),
        )
        return await asyncio.to_thread(find, recipe)  # in the cache now


def _both(
    first: Callable[[str], None], second: Callable[[str], None] | None
) -> Callable[[str], None]:
    if second is None:
        return first

    def tell(message: str) -> None:
        first(message)
        second(message)

    return tell
