"""A lazily held image (issue 29): the cache entry a node makes for bytes it needs by
content (a capture taken over them on another node) when `AENV_LAZY_IMAGES=on`, instead of
downloading the whole disk.

`images/<content>/` then holds the kernel and initramfs (fetched whole: a few MiB), the
builder's `manifest.json` with `content` rebuilt from the repository's chunk list, and
`root.lazy.qcow2`: an empty qcow2 of the disk's size over the node's block service
(`shared/lazybase.py`), which serves the image's blocks by NBD, export = the content
digest, fetching each 4 MiB chunk from the repository on its first read. QEMU sees one
more (empty) layer; everything else sees the stub as the base (`shared/lazybase.py`).

Such an entry is never linked as `recipes/<recipe>`: a recipe's entry is whole (a
build's, a fetch's). A whole copy fetched later goes into the same directory beside the
stub (`cache.publish_content`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.lazybase import LAZY_ROOT, RECONNECT_DELAY_S, nbd_backing
from workers.node.runtime.qcow2 import write_overlay

from . import cache as _cache

__all__ = ["LazyImages", "make_lazy_entry"]


@dataclass(frozen=True)
class LazyImages:
    """Where this node's block service listens, and how long QEMU waits for it."""

    socket: Path
    #: a guest's reads wait this long for a restarted service (then fail as I/O errors)
    reconnect_delay_s: int = RECONNECT_DELAY_S
    #: a VM start waits this long for the service to answer
    open_timeout_s: int = 10


def make_lazy_entry(
    tmp: Path,
    lazy: LazyImages,
    *,
    digest: str,
    size: int,
    chunk_size: int,
    chunks: list[str | None],
    meta: dict[str, Any],
) -> Path:
    """Complete the staging dir `tmp` (kernel and initramfs already in it) as a lazy entry
    for the image `digest`: its stub and its manifest. Returns the stub's path in `tmp`."""
    stub = tmp / LAZY_ROOT
    spec = nbd_backing(
        lazy.socket,
        digest,
        reconnect_delay_s=lazy.reconnect_delay_s,
        open_timeout_s=lazy.open_timeout_s,
    )
    write_overlay(stub, spec, "raw", size)
    doc = {
        **meta,
        # no stamp: the stub's bytes are not the image's (`content.content_of` knows)
        "content": {"digest": digest, "size": size, "chunk_size": chunk_size, "chunks": chunks},
        "lazy": {
            "socket": str(lazy.socket),
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }
    (tmp / _cache.MANIFEST).write_text(json.dumps(doc, indent=2) + "\n")
    return stub
