"""`CacheEvictor`: the node's evictable entries as they lie on disk, and their removal
(the I/O side of `evict.plan`, images-at-scale S8).

Entries: image cache `images/<content>/` (image or runtime disk), `layers/<chain>` (chain),
`blobs/sha256/*` and `oci/<key>` (OCI blobs and layouts), `rootfs-*` (debootstrap trees),
the state dir's `blob-cache/` files and the RAM pool's ready copies (`ram-pool/`). Each is
measured once per (path, inode, mtime): entries are immutable once published, so the
heartbeat's `room()` re-lists directories but does not re-walk trees. An entry's size is
what removing it frees (`shares`): blocks hard-linked from outside it are not its own; a
removal measures again, and says what it really freed. Entries built before content keys
(`<recipe>/` in the cache root) are counted by the walk but not evicted here.

A directory is removed by renaming it aside first (`discard`): a kill mid-delete leaves a
`.gone-` name that the next listing sweeps, never a half entry. Removing an image removes
its directory (renamed under its content lock, the one a fetch by content takes) and every
`recipes/` link to it: the next create of a template on it fetches it back
by content (`ImageSupply.by_content`) or, for an import, the recipe is fetched or built
again (`ImageSupply.oci_import`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from workers.node.disk.categories import Category
from workers.node.disk.discard import GONE, gone_aside, parents, sweep, sweep_gone
from workers.node.disk.evict import Entry
from workers.node.disk.shares import Holding, attribute, holding
from workers.node.image import cache as _cache

__all__ = ["CacheEvictor", "RamCopies"]


class CaptureSource(Protocol):
    """Captures as entries (`captures.TemplateCaptures`): listed, in use, removed."""

    def entries(self) -> list[Entry]: ...

    def in_use(self) -> set[str]: ...

    def remove(self, entry: Entry) -> int: ...


class RamCopies(Protocol):
    """The RAM pool's ready copies (`rampool.RamPool`): listed and dropped through the pool,
    so its own byte count stays right; a copy being made is never listed."""

    def ready_files(self) -> list[Path]: ...

    def drop(self, path: Path) -> bool:
        """Remove a ready copy; False: a create took it meanwhile (nothing freed)."""
        ...


class CacheEvictor:
    """Entries of one image cache and one state dir (either may be None)."""

    def __init__(self, image_cache: Path | None, state_dir: Path | None) -> None:
        self.image_cache = image_cache
        self.state_dir = state_dir
        self._sizes: dict[str, tuple[int, int, Holding]] = {}  # key -> (ino, mtime_ns, ...)
        #: files captures and the runtime stand on (a capture's base image, the runtime
        #: disk): their entries are in use even with no VM running
        self.held: Callable[[], Iterable[Path]] = lambda: ()
        #: the node's template captures (None: a node without VMs)
        self.captures: CaptureSource | None = None
        #: the repository blob cache's own removal (`BlobCache.drop`: it keeps the blobs a
        #: download holds, and its index); None: files are unlinked as they are
        self.drop_blob: Callable[[Path], bool] | None = None
        self._removing: set[Path] = set()  # `.gone-` dirs this evictor is deleting now
        #: the RAM pool's copies of template RAM files (None: a node without VMs)
        self.ram_pool: RamCopies | None = None

    # ---- listing -----------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        out: list[Entry] = []
        root = self.image_cache
        if root is not None and root.is_dir():
            sweep_gone(parents(root), self._removing)  # what a killed removal left
            for d in _children(root / _cache.IMAGES):
                if not d.name.startswith(".") and (d / _cache.MANIFEST).is_file():
                    kind: Category = "runtime" if (d / "runtime.ext4").exists() else "image"
                    out += self._entry(d, kind)
            for d in _children(root / "layers"):
                out += self._entry(d, "chain") if not d.name.startswith(GONE) else []
            for d in _children(root / "oci"):
                out += self._entry(d, "oci_blob") if not d.name.startswith(GONE) else []
            for f in _children(root / "blobs" / "sha256"):
                out += self._entry(f, "oci_blob")
            for d in _children(root):
                if d.name.startswith("rootfs-") and d.is_dir():
                    out += self._entry(d, "rootfs_tree")
        if self.state_dir is not None:
            for f in _files(self.state_dir / "blob-cache"):
                out += self._entry(f, "blob_cache")
        if self.ram_pool is not None:
            for f in self.ram_pool.ready_files():
                out += self._entry(f, "ram_pool")
        live = {e.key for e in out}
        for gone in set(self._sizes) - live:
            del self._sizes[gone]
        out = attribute(out, {k: self._sizes[k][2] for k in live})
        if self.captures is not None:
            out += self.captures.entries()
        return out

    def _entry(self, path: Path, category: Category) -> list[Entry]:
        try:
            st = os.lstat(path)
        except OSError:
            return []
        key = str(path)
        known = self._sizes.get(key)
        if known is None or known[:2] != (st.st_ino, st.st_mtime_ns):
            self._sizes[key] = (st.st_ino, st.st_mtime_ns, holding(path))
        return [Entry(key, category, self._sizes[key][2].own, st.st_mtime)]

    def in_use(self) -> set[str]:
        """Image entries whose files a process has open (a running or warm VM's QEMU), or
        that a capture or the runtime stands on (`held`)."""
        out = set(self.captures.in_use()) if self.captures is not None else set()
        root = self.image_cache
        if root is None:
            return out
        images = str((root / _cache.IMAGES).resolve()) + "/"  # as /proc and resolve() say
        for f in [*_cache.open_files(), *(str(p.resolve()) for p in self.held())]:
            if f.startswith(images):
                out.add(str(root / _cache.IMAGES / f[len(images) :].split("/", 1)[0]))
        return out

    # ---- removal -----------------------------------------------------------------------
    def remove(self, entry: Entry) -> int:
        """Remove the entry; the bytes of the inodes it alone linked to (measured now: what
        the listing counted may be shared bytes it was to free with others gone first)."""
        path = Path(entry.key)
        if entry.category == "capture":
            return self.captures.remove(entry) if self.captures is not None else 0
        held = holding(path)
        self._forget(held)
        if entry.category == "ram_pool":
            if self.ram_pool is None or not self.ram_pool.drop(path):
                return 0  # taken by a create meanwhile: nothing freed
        elif entry.category == "blob_cache" and self.drop_blob is not None:
            if not self.drop_blob(path):
                return 0  # a download holds it
        elif entry.category in ("image", "runtime"):
            self._delete(self._image_aside(path))
        elif path.is_dir() and not path.is_symlink():
            self._delete(gone_aside(path))
        else:
            path.unlink(missing_ok=True)
        self._sizes.pop(entry.key, None)
        return held.own

    def sweep(self) -> None:
        """At node start: what a removal or a build killed midway left (`discard.sweep`)."""
        if self.image_cache is not None and self.image_cache.is_dir():
            sweep(self.image_cache, self._removing)

    def _delete(self, gone: Path | None) -> None:
        if gone is None:
            return
        self._removing.add(gone)
        try:
            shutil.rmtree(gone, ignore_errors=True)
        finally:
            self._removing.discard(gone)

    def _forget(self, gone: Holding) -> None:
        """Measure again the entries that share inodes with one going: their links' count
        drops, and what they alone hold grows."""
        for key, (_, _, held) in list(self._sizes.items()):
            if not gone.shared.keys().isdisjoint(held.shared):
                del self._sizes[key]

    def _image_aside(self, entry: Path) -> Path | None:
        """Under its content lock (a fetch by content waits): its `recipes/` links gone,
        then the entry renamed aside whole (a kill later leaves a `.gone-`, never a
        half entry); deleting it needs no lock."""
        root, key = _cache.lock_of(entry)
        with _cache.locked(root, key):
            for link in _children(root / _cache.RECIPES):
                if link.is_symlink() and link.resolve() == entry.resolve():
                    link.unlink(missing_ok=True)
            return gone_aside(entry)


def _children(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def _files(directory: Path) -> list[Path]:
    out = []
    for dirpath, _, filenames in os.walk(directory):
        for name in filenames:
            if not name.startswith("."):
                out.append(Path(dirpath) / name)
    return out
