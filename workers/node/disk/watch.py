"""The node's disk usage: a full walk of its roots in a thread at the lowest priority
(`foreground.in_background`), run every minute by `node.py::NodeDisk`, whose budget evicts
on what it finds. A walk of a large cache takes seconds of metadata reads, so readers get
the last walk's answer, never one made while a heartbeat or a scrape waits.
"""

from __future__ import annotations

import os
from pathlib import Path

from workers.node.disk.categories import IMAGES, STATE, RootKind
from workers.node.disk.usage import Tally, scan
from workers.node.foreground import in_background

__all__ = ["SCAN_EVERY_S", "DiskUsage", "image_cache_dir"]

#: How often the walk runs: disk fills over minutes (imports, captures), not seconds.
SCAN_EVERY_S = 60.0

# the image cache's location, as `workers/node/image/cache.py::cache_root` finds it,
# without its mkdir: a node that builds no images (memory host) must not create one
_CACHE_ENV, _DEFAULT_CACHE = "AENV_IMAGE_CACHE", Path("/var/lib/aenv/images")


def image_cache_dir() -> Path:
    """Where this node's image cache is ($AENV_IMAGE_CACHE, else the default)."""
    return Path(os.environ.get(_CACHE_ENV) or _DEFAULT_CACHE)


class DiskUsage:
    """The last walk of a node's roots (None until the first one ends)."""

    def __init__(self, state_dir: Path, image_cache: Path | None) -> None:
        self.roots: list[tuple[RootKind, Path]] = [(STATE, state_dir)]
        if image_cache is not None:
            self.roots.append((IMAGES, image_cache))
        self.last: Tally | None = None

    def used(self) -> int | None:
        """Bytes the node's roots allocate, per the last walk."""
        return self.last.total if self.last is not None else None

    def walk_now(self) -> Tally:
        """A walk in this thread (blocking): the disk budget's first answer."""
        self.last = scan(self.roots)
        return self.last

    async def refresh(self) -> Tally:
        self.last = await in_background(scan, self.roots)
        return self.last
