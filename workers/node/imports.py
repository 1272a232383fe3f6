"""An image made into a guest image for a template on this node: a local OCI layout or
archive converted, or a registry reference pulled into the node's layer cache first (its
login, for a private registry, read from the secrets bucket by the worker).

With a repository (`ImageSupply.fleet_wide`), a registry image is built once per fleet
(images-at-scale S5): its manifest digest is read from the registry first (`resolve`, no
layer pulled), which names its recipe; the node that wins the recipe's claim pulls,
unpacks and converts it and uploads the disk, and every other node importing the same
image — under any name or tag — fetches those bytes instead of pulling a layer. A local
layout is named by its manifest digest the same way: built where it is, published, and
fetched by any other node that creates its template."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from workers.node.disk.budget import DiskBudget
from workers.node.image import GuestImage, build_from_oci
from workers.node.image.cache import cache_root
from workers.node.image.disk import DEFAULT_FREE
from workers.node.image.errors import DiskFull
from workers.node.image.leftovers import Made, disk_full, forget_on_failure, tidy_after_import
from workers.node.image.oci import open_layout
from workers.node.image.registry import (
    ImageRef,
    Pulled,
    RegistryAuth,
    Resolved,
    parse_reference,
    pull,
    resolve,
)
from workers.node.image.supply import ImageSupply
from workers.node.import_budget import budgeted
from workers.node.ports import HostError, ImageSource

__all__ = ["convert_image", "import_image"]

log = logging.getLogger(__name__)


def _progress(name: str, tell: Callable[[str], None] | None) -> Callable[[str], None]:
    def progress(message: str) -> None:
        log.info("import %s: %s", name, message)
        if tell is not None:
            tell(message)

    return progress


def _auth(source: ImageSource) -> RegistryAuth | None:
    if source.username is None:
        return None
    return RegistryAuth(source.username, source.password or "")


def _free(source: ImageSource, free_bytes: int) -> int:
    return free_bytes if source.free_bytes is None else source.free_bytes


async def import_image(
    name: str,
    source: ImageSource,
    tell: Callable[[str], None] | None,
    *,
    free_bytes: int = DEFAULT_FREE,
    supply: ImageSupply | None = None,
    budget: DiskBudget | None = None,
) -> GuestImage:
    """The guest image of `source` (`_import`); a full disk — while pulling, unpacking,
    in mkfs (`DiskFull`, after the import's cleanup) or fetching the fleet's bytes — is
    `HostError` with code `unavailable` ("node disk full: ..."): another node with room can
    take the import."""
    try:
        return await _import(
            name, source, tell, free_bytes=free_bytes, supply=supply, budget=budget
        )
    except Exception as e:
        if isinstance(e, DiskFull):
            raise HostError(str(e), code="unavailable") from e
        if disk_full(e):
            where = supply.root if supply is not None else cache_root()
            message = f"node disk full: import of {name} in {where}: {e}"
            raise HostError(message, code="unavailable") from e
        raise


async def _import(
    name: str,
    source: ImageSource,
    tell: Callable[[str], None] | None,
    *,
    free_bytes: int = DEFAULT_FREE,
    supply: ImageSupply | None = None,
    budget: DiskBudget | None = None,
) -> GuestImage:
    """The guest image of `source` through the fleet when `supply` has one (see above): a
    registry image, or a local layout (`aenv pull <dir>`: only this node can build it, but
    every other node can then fetch its bytes — a create of the template elsewhere needs
    them); on a node without a repository, built here (`convert_image`, in a thread)."""
    if supply is None or not supply.fleet_wide:
        return await asyncio.to_thread(
            convert_image, name, source, tell, free_bytes=free_bytes, budget=budget
        )
    if source.ref is None:
        return await _local_layout(name, source, tell, free_bytes, supply)
    progress = _progress(name, tell)
    auth = _auth(source)
    ref = parse_reference(source.ref)
    resolved = await asyncio.to_thread(resolve, ref, auth=auth, progress=progress)
    free = _free(source, free_bytes)

    def build() -> GuestImage:  # the claim's winner only
        return _pulled(name, ref, auth, progress, free, resolved, cache=supply.root, budget=budget)

    return await supply.oci_import(resolved.manifest, f"tpl-{name}", free, build, progress=tell)


async def _local_layout(
    name: str,
    source: ImageSource,
    tell: Callable[[str], None] | None,
    free_bytes: int,
    supply: ImageSupply,
) -> GuestImage:
    """A local OCI layout or archive, named by its manifest digest (read, nothing unpacked):
    built here unless the fleet has its bytes already, and published either way."""
    path = Path(source.path or "")
    free = _free(source, free_bytes)
    progress = _progress(name, tell)
    manifest = await asyncio.to_thread(_manifest_of, path)

    def build() -> GuestImage:  # the claim's winner only
        return _built(name, path, progress, free, supply.root)

    return await supply.oci_import(manifest, f"tpl-{name}", free, build, progress=tell)


def _manifest_of(path: Path) -> str:
    with open_layout(path) as layout:
        return layout.manifest_digest


def _pulled(
    name: str,
    ref: ImageRef,
    auth: RegistryAuth | None,
    progress: Callable[[str], None],
    free: int,
    resolved: Resolved | None = None,
    *,
    cache: Path | None = None,
    budget: DiskBudget | None = None,
) -> GuestImage:
    """Pull into the layer cache and convert: the registry's manifest digest names it.
    Under a disk `budget`, each step reserves what it will write first (`budgeted`); a
    failure leaves nothing the attempt made (`forget_on_failure`)."""
    root = cache_root(cache)
    with forget_on_failure(root, f"import of {ref} in {root}") as made:
        if budget is not None:

            def convert(pulled: Pulled) -> GuestImage:
                return _convert(name, pulled, progress, free, cache, made)

            return budgeted(budget, ref, auth, progress, free, resolved, cache, convert, made)
        pulled = pull(ref, cache=cache, auth=auth, progress=progress, resolved=resolved, made=made)
        return _convert(name, pulled, progress, free, cache, made)


def _convert(
    name: str,
    pulled: Pulled,
    progress: Callable[[str], None],
    free: int,
    cache: Path | None,
    made: Made,
) -> GuestImage:
    """The pulled image built; then what only this build needed goes (its layout, its own
    layers' blobs, its whole-stack chain: `leftovers.finished`), its lower layers stay."""
    image = build_from_oci(
        pulled.layout,
        f"tpl-{name}",
        cache,
        progress=progress,
        ref="image",
        blobs=pulled.blobs,
        free_bytes=free,
        manifest=pulled.manifest,
        made=made,
    )
    tidy_after_import(cache_root(cache), made, pulled.layout)
    return image


def _built(
    name: str, path: Path, progress: Callable[[str], None], free: int, cache: Path | None = None
) -> GuestImage:
    """A local layout or archive converted; a failure leaves no chain it kept."""
    root = cache_root(cache)
    with forget_on_failure(root, f"import of {path} in {root}") as made:
        return build_from_oci(
            path, f"tpl-{name}", cache, progress=progress, free_bytes=free, made=made
        )


def convert_image(
    name: str,
    source: ImageSource,
    tell: Callable[[str], None] | None,
    *,
    free_bytes: int = DEFAULT_FREE,
    budget: DiskBudget | None = None,
) -> GuestImage:
    """Blocking (a thread's work): pull, unpack, convert — each step said to `tell` and
    logged. Cached by content, so an image imported again costs only the lookups. The root
    disk keeps the source's free space if it asks for one, else `free_bytes`."""
    free = _free(source, free_bytes)
    progress = _progress(name, tell)
    if source.ref is None:
        return _built(name, Path(source.path or ""), progress, free)
    return _pulled(name, parse_reference(source.ref), _auth(source), progress, free, budget=budget)
