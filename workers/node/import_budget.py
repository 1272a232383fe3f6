"""A registry import under the node's disk budget (images-at-scale S8): each step reserves
what it will write before it writes, evicting what the budget allows, and is refused as
`unavailable` (`disk.NoRoom`: placement hands the create to another node) if it cannot fit.

1. the pull: the layers' compressed sizes (the registry's manifest says them) into
   `blobs/` and `oci/`;
2. the build: the unpacked chain and the root disk made from it (`produced.disk_need` of
   the layers' uncompressed sizes), while the pull's blobs and layout are pinned (the
   eviction that makes this room must not take them).

What each step left is charged by listing the directories it writes into. An image the
cache already holds under the recipe reserves nothing for its build.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from workers.node.disk.budget import DiskBudget
from workers.node.disk.produced import disk_need, unpacked_bytes, writing
from workers.node.image import GuestImage
from workers.node.image import cache as _cache
from workers.node.image.build import oci_recipe
from workers.node.image.leftovers import Made
from workers.node.image.registry import ImageRef, Pulled, RegistryAuth, Resolved, pull, resolve

__all__ = ["budgeted"]

#: the manifest, config and index files a pull writes beside its layers
PULL_EXTRA = 16 << 20


def budgeted(
    budget: DiskBudget,
    ref: ImageRef,
    auth: RegistryAuth | None,
    progress: Callable[[str], None],
    free: int,
    resolved: Resolved | None,
    cache: Path | None,
    convert: Callable[[Pulled], GuestImage],
    made: Made | None = None,
) -> GuestImage:
    """Pull `ref` and `convert` it (blocking), each under a reservation (see above)."""
    root = _cache.cache_root(cache)
    got = resolved or resolve(ref, auth=auth, progress=progress)
    pulled_into = [root / "blobs" / "sha256", root / "oci"]
    with writing(budget, sum(got.sizes) + PULL_EXTRA, pulled_into):
        pulled = pull(ref, cache=root, auth=auth, progress=progress, resolved=got, made=made)
    blobs = _blobs_of(pulled)
    keys = [str(pulled.layout), *(str(b) for b in blobs)]
    for used in [pulled.layout, *blobs]:  # used now: least recently used goes first
        budget.touch(used)
    recipe = oci_recipe(got.manifest, root, progress=progress, free_bytes=free)
    with budget.pinned_while(keys):
        if (held := _cache.entry_dir(root, recipe)) is not None:
            budget.touch(held)
            return convert(pulled)  # cached: found, nothing built
        unpacked = sum(
            unpacked_bytes(pulled.blobs / "sha256" / d.split(":", 1)[1]) for d in got.layers
        )
        # the root too: a kernel built now (`kernel-*/`) is linked into the image
        made_into = [root / "layers", root / _cache.IMAGES, root]
        with writing(budget, disk_need(unpacked), made_into):
            return convert(pulled)


def _blobs_of(pulled: Pulled) -> list[Path]:
    """Every blob the pulled layout names (its manifests, configs and layers)."""
    sha = pulled.blobs / "sha256"
    out: list[Path] = []
    index = json.loads((pulled.layout / "index.json").read_text())
    for m in index.get("manifests") or []:
        manifest = sha / str(m["digest"]).split(":", 1)[1]
        out.append(manifest)
        doc = json.loads(manifest.read_text())
        for d in [doc.get("config") or {}, *(doc.get("layers") or [])]:
            if "digest" in d:
                out.append(sha / str(d["digest"]).split(":", 1)[1])
    return out
