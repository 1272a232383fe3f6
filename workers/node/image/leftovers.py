"""A failed image import leaves nothing (images-at-scale S8, issue 42).

An import that fails — a pull error, a corrupt or truncated layer, an unpack error, mkfs
running out of room, any exception — used to leave what it had made so far: skopeo's
blobs, the layer chains kept before the failure, its OCI layout (a failed 2.3 GiB build
left 3.6 GiB). The build's own scratch (`.tmp-*`: the tree, the partial ext4) was already
removed by `cache.staging`; the rest is shared cache, so it cannot simply be swept.

So the attempt keeps a ledger, `Made`, filled where things are created (`registry.pull`
notes the blobs it wrote and the layout it created, `oci.unpack` the chains it kept). On
failure `forget_on_failure` removes exactly that, minus what another image holds
(`Held`: what every other OCI layout in the cache names — its blobs, and the chains of
its layers). Shared base layers an earlier import made were never in the ledger, so they
stay. The decision (`leftovers`) is pure; reading the holds and removing are the I/O.

An ENOSPC anywhere in the failure becomes `DiskFull` ("node disk full: ..."), after the
same cleanup: the node worker answers it as `unavailable`, so another node can take it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DiskFull
from .oci_chains import chain_dir, chain_ids

__all__ = [
    "Held",
    "Made",
    "blob_file",
    "disk_full",
    "disk_full_error",
    "forget_on_failure",
    "held_by_others",
    "leftovers",
]


@dataclass
class Made:
    """What one import attempt created in the cache (filled as it goes): blobs by digest
    (`sha256:<hex>`), chains by chain id, OCI layout directories."""

    blobs: set[str] = field(default_factory=set)
    chains: set[str] = field(default_factory=set)
    layouts: set[Path] = field(default_factory=set)


@dataclass(frozen=True)
class Held:
    """What other images in the cache name, so a failed attempt must leave it."""

    blobs: frozenset[str] = frozenset()
    chains: frozenset[str] = frozenset()


def leftovers(made: Made, held: Held) -> Made:
    """What a failed attempt must remove: all it made that no other image holds. A layout
    directory is the attempt's own (one per reference, made by it), so it always goes."""
    return Made(
        blobs=made.blobs - held.blobs,
        chains=made.chains - held.chains,
        layouts=set(made.layouts),
    )


def disk_full(error: BaseException) -> bool:
    """Whether a failure comes from a full disk: an `OSError(ENOSPC)` anywhere in its
    chain of causes, or a tool's message saying so (skopeo, mkfs and cp report it on
    stderr, which reaches us only as text)."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        if "no space left on device" in str(e).lower():
            return True
        e = e.__cause__ or e.__context__
    return False


def blob_file(blobs: Path, digest: str) -> Path:
    """Where a shared blob directory keeps a digest's bytes (`<algo>/<hex>`)."""
    return blobs / digest.replace(":", "/", 1)


def _json(path: Path) -> dict[str, object]:
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path} is not a JSON object")
    return doc


def _layout_holds(layout: Path, blobs: Path) -> tuple[set[str], set[str]]:
    """The blobs and chains one layout names: its manifests, their configs and layers,
    and the chain ids of each config's diff_ids."""
    named: set[str] = set()
    chains: set[str] = set()
    index = _json(layout / "index.json")
    for entry in index.get("manifests") or []:  # type: ignore[attr-defined]
        digest = str(entry["digest"])
        named.add(digest)
        manifest = _json(blob_file(blobs, digest))
        config = str(manifest["config"]["digest"])  # type: ignore[index]
        named.add(config)
        named.update(str(d["digest"]) for d in manifest.get("layers") or [])  # type: ignore[attr-defined]
        rootfs = _json(blob_file(blobs, config)).get("rootfs") or {}
        chains.update(chain_ids(list(rootfs.get("diff_ids") or [])))  # type: ignore[attr-defined]
    return named, chains


def held_by_others(root: Path, mine: set[Path]) -> Held:
    """What every OCI layout in the cache but `mine` names. A layout that cannot be read
    is one mid-pull or broken; it holds nothing it can name."""
    blobs: set[str] = set()
    chains: set[str] = set()
    oci = root / "oci"
    for layout in sorted(oci.iterdir()) if oci.is_dir() else ():
        if layout in mine or not layout.is_dir():
            continue
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            named, kept = _layout_holds(layout, root / "blobs")
            blobs |= named
            chains |= kept
    return Held(frozenset(blobs), frozenset(chains))


def remove(root: Path, plan: Made) -> None:
    """Remove what `leftovers` decided (what is already gone is no error)."""
    for digest in plan.blobs:
        blob_file(root / "blobs", digest).unlink(missing_ok=True)
    for chain in plan.chains:
        shutil.rmtree(chain_dir(root / "layers", chain), ignore_errors=True)
    for layout in plan.layouts:
        shutil.rmtree(layout, ignore_errors=True)


@contextlib.contextmanager
def forget_on_failure(root: Path, what: str) -> Iterator[Made]:
    """A ledger for one import attempt into cache `root`; if the body fails, what it made
    goes (see above), and a full disk is raised as `DiskFull` naming `what`."""
    made = Made()
    try:
        yield made
    except BaseException as e:
        remove(root, leftovers(made, held_by_others(root, made.layouts)))
        if isinstance(e, Exception) and disk_full(e) and not isinstance(e, DiskFull):
            raise DiskFull(f"node disk full: {what}: {e}") from e
        raise


@contextlib.contextmanager
def disk_full_error(what: str) -> Iterator[None]:
    """A full disk in the body is raised as `DiskFull` naming `what` (the scratch of a
    build without a ledger — the base image, a runtime disk — goes with `cache.staging`)."""
    try:
        yield
    except Exception as e:
        if disk_full(e) and not isinstance(e, DiskFull):
            raise DiskFull(f"node disk full: {what}: {e}") from e
        raise
