"""What each byte on a node's disk is, from where it lies (images-at-scale §0's table).

A pure function of a path relative to its root, so the rules are tested without a walk
and the walker (`usage.py`) only has to ask. The categories follow what the disk budget
(S8) will do with them: regenerable caches, durable images and captures, and what is
never evicted (running VMs, build scratch).
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Literal, get_args

__all__ = ["CATEGORIES", "IMAGES", "STATE", "Category", "RootKind", "category_of"]

Category = Literal[
    "image",
    "runtime",
    "kernel",
    "rootfs_tree",
    "oci_blob",
    "chain",
    "scratch",
    "vm",
    "layer",
    "capture",
    "ram_pool",
    "blob_cache",
    "volume",
    "other",
]
#: every category, in the order reports list them (a closed set: a label value each)
CATEGORIES: tuple[Category, ...] = get_args(Category)

RootKind = Literal["images", "state"]
#: the image cache (`AENV_IMAGE_CACHE`, `workers/node/image/cache.py`'s layout)
IMAGES: RootKind = "images"
#: the node's state dir (`AENV_STATE_DIR`: VMs, layers, captures, pools, volumes)
STATE: RootKind = "state"

_DIGEST = re.compile(r"[0-9a-f]{64}")
_STATE_DIRS: dict[str, Category] = {
    "vms": "vm",
    "layers": "layer",
    "snapshots": "capture",
    "ram-pool": "ram_pool",
    "blob-cache": "blob_cache",
    # the block service's chunk cache (issue 29): repository blobs too, capped by the
    # service itself (`AENV_BLOCKS_CACHE_BYTES`), not evicted by the budget: its cap is held
    # as room in the budget for the service's life (`chunkroom.py`), this counted once in it
    "blocks": "blob_cache",
    "volumes": "volume",
}


def category_of(kind: RootKind, rel: PurePath) -> Category:
    """The category of the file or directory at `rel` under a root of this kind.

    Under `images/<content>/` only the file `runtime.ext4` marks a runtime entry: the
    entry's small `manifest.json` and the directory itself count as `image` (a few KiB
    misplaced, and the rule stays a function of the path alone)."""
    parts = rel.parts
    if not parts:
        return "other"
    top = parts[0]
    if kind == STATE:
        return _STATE_DIRS.get(top, "other")  # journal, snapshot-templates: small records
    return _image_category(top, parts)


def _image_category(top: str, parts: tuple[str, ...]) -> Category:
    if top == "images":
        return "runtime" if len(parts) >= 3 and parts[-1] == "runtime.ext4" else "image"
    if top.startswith("runtime-"):  # built before content keys, in place
        return "runtime"
    if _DIGEST.fullmatch(top):
        return "image"
    if top.startswith("kernel-"):
        return "kernel"
    if top.startswith("rootfs-"):
        return "rootfs_tree"
    if top in ("blobs", "oci"):
        return "oci_blob"
    if top == "layers":
        return "chain"
    if top.startswith(".tmp-") or top == ".locks":
        return "scratch"
    return "other"  # recipes/ and names/ (links), anything unknown
