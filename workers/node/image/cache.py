"""The on-disk image cache: content-addressed directories, built aside, published by rename.

Layout under the cache root (default /var/lib/aenv/images, env AENV_IMAGE_CACHE):
    images/<content>/{vmlinux, initrd.cpio, root.ext4, manifest.json}
                                                               a complete image, named by
                                                               its root disk's bytes
    images/<content>/{vmlinux, initrd.cpio, root.lazy.qcow2, manifest.json}
                                                               the same, its disk held
                                                               lazily (`shared/lazybase.py`)
    images/<content>/{runtime.ext4, manifest.json}             an envd runtime disk
    recipes/<recipe> -> ../images/<content>                    what a recipe built (a
    recipes/runtime-<recipe> -> ../images/<content>            runtime's: runtime-<recipe>)
    <recipe>/, runtime-<recipe>/                               images built before content
                                                               keys (still found, in place)
    kernel-<release>-<version>/{vmlinux, modules/, kernel.json} shared kernel (vmlinux is
                                                               hard-linked into images)
    rootfs-<digest>/                                           cached debootstrap tree
    names/<name> -> ../recipes/<recipe>                        images built under a name
    .locks/<key>.lock                                          flock per cache entry
    .tmp-<key>-*                                               builds in progress
    .gone-<name> (here, in images/, layers/, oci/)             an entry being deleted
                                                               (`disk.discard`)
A directory named by a digest only ever appears complete: it is assembled in a `.tmp-`
sibling and renamed into place while holding that key's lock.

Why by content (issue 40): a capture's qcow2 layers are only valid over the exact bytes
they were written over. Keyed by recipe, a forced rebuild replaced the disk under every
capture stacked on it; keyed by content, a rebuild that gives the same bytes is the same
entry, one that gives other bytes is a new entry beside the old one (which stays for the
captures over it until `gc`), and a recipe only ever moves its `recipes/` link.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shared.lazybase import LAZY_ROOT

from .fsutil import unmount_under

DEFAULT_CACHE = Path("/var/lib/aenv/images")
CACHE_ENV = "AENV_IMAGE_CACHE"


def cache_root(cache: Path | None = None) -> Path:
    """The cache directory to use (argument, then $AENV_IMAGE_CACHE, then the default)."""
    root = cache or Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
    root.mkdir(parents=True, exist_ok=True)
    return root


def digest_of(inputs: dict[str, object]) -> str:
    """sha256 hex over canonical JSON of a build's inputs (key order does not matter)."""
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


@contextmanager
def locked(root: Path, key: str, *, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive flock for `key` (blocks while another builder holds it); with
    `wait=False`, yield False at once if someone holds it (and hold nothing).

    Also clears `.tmp-<key>-*` leftovers (and anything mounted in them): whoever left
    them died holding this lock.
    """
    locks = root / ".locks"
    locks.mkdir(exist_ok=True)
    with (locks / f"{key}.lock").open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            for stale in root.glob(f".tmp-{key}-*"):
                # a killed debootstrap may have left /proc etc. mounted in there:
                # detach first, or rmtree would walk into them
                unmount_under(stale)
                shutil.rmtree(stale, ignore_errors=True)
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def staging(root: Path, key: str) -> Iterator[Path]:
    """A scratch directory on the cache's filesystem (so the final rename is atomic).

    Removed afterwards unless the caller has renamed it away.
    """
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root))
    tmp.chmod(0o755)  # becomes the published directory; mkdtemp makes it 0700
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


IMAGES = "images"
RECIPES = "recipes"
MANIFEST = "manifest.json"


def entry_dir(root: Path, recipe: str) -> Path | None:
    """The complete entry a recipe built (its `recipes/` link, resolved), else one built
    before content keys under the recipe's own name; None if neither is there."""
    for d in (root / RECIPES / recipe, root / recipe):
        if (d / MANIFEST).is_file():
            return d.resolve()
    return None


#: An image entry's whole root disk (a raw ext4).
ROOT_DISK = "root.ext4"


def root_disk(entry: Path) -> Path:
    """An image entry's root disk: the whole raw file if the entry holds it, else its lazy
    base's stub (issue 29: the disk's blocks come through the node's block service)."""
    whole = entry / ROOT_DISK
    if whole.exists() or not (entry / LAZY_ROOT).exists():
        return whole
    return entry / LAZY_ROOT


def content_dir(root: Path, content: str) -> Path | None:
    """The complete entry holding exactly these bytes, if this cache has it."""
    d = root / IMAGES / content
    return d if (d / MANIFEST).is_file() else None


def publish_content(root: Path, tmp: Path, recipe: str | None, content: str) -> Path:
    """Publish a finished build as `images/<content>` and point `recipes/<recipe>` at it
    (caller holds the recipe's lock; None: no link, the bytes are wanted by content only).
    Bytes already there (a rebuild that gave the same disk) are kept as they are and the
    new copy dropped: captures may be stacked on them."""
    images = root / IMAGES
    images.mkdir(exist_ok=True)
    final = images / content
    _fill_lazy(tmp, final)
    if not (final / MANIFEST).is_file():
        if final.exists():  # not complete, so never published: a crash's leftover
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError as e:
            # another recipe's build of the very same bytes got there first
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not (final / MANIFEST).is_file():
                raise
    if recipe is not None:
        _link(root / RECIPES, recipe, f"../{IMAGES}/{content}")
    return final


def _fill_lazy(tmp: Path, final: Path) -> None:
    """A whole copy of bytes this cache held lazily: its disk (and manifest, which records
    that file's stamp) moved into the lazy entry, beside the stub. The stub stays: VMs and
    layers may stand on it; new ones take the whole file (`root_disk`)."""
    whole = tmp / ROOT_DISK
    if not (final / LAZY_ROOT).exists() or (final / ROOT_DISK).exists() or not whole.exists():
        return
    os.rename(whole, final / ROOT_DISK)
    os.replace(tmp / MANIFEST, final / MANIFEST)


def _link(directory: Path, name: str, target: str) -> None:
    """`directory/name -> target`, atomically replacing an older link."""
    directory.mkdir(exist_ok=True)
    # (per thread: two builds of one process linking the same name at once each need
    # their own temporary link, or one's rename finds the other's gone)
    tmp = directory / f".{name}.{os.getpid()}.{threading.get_ident()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, directory / name)


def link_name(root: Path, name: str, digest: str) -> None:
    """Point `names/<name>` at what recipe `digest` built (atomically replacing an older
    target); through `recipes/`, so the name follows a rebuild."""
    target = f"../{RECIPES}/{digest}" if (root / RECIPES / digest).is_symlink() else f"../{digest}"
    _link(root / "names", name, target)


def entries(root: Path) -> list[Path]:
    """Every complete entry: by content, and those built before content keys."""
    found = [d for d in root.iterdir() if d.is_dir() and (d / MANIFEST).is_file()]
    if (root / IMAGES).is_dir():
        found += [
            d
            for d in (root / IMAGES).iterdir()
            if not d.name.startswith(".") and (d / MANIFEST).is_file()
        ]
    return found


def lock_of(entry: Path) -> tuple[Path, str]:
    """The cache root and lock key that guard an entry's directory."""
    if entry.parent.name == IMAGES:
        return entry.parent.parent, f"content-{entry.name}"
    return entry.parent, entry.name


def open_files() -> set[str]:
    """Paths any process on the host has open (what a running QEMU holds)."""
    out: set[str] = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    out.add(os.readlink(fd))
        except OSError:
            continue  # the process ended or is not ours to inspect
    return out


def collect_garbage(root: Path, keep: int, *, dry_run: bool = False) -> list[Path]:
    """Remove old images: all but the `keep` newest, never a named one or one in use.

    "In use" can only be seen for open files; an image that a stopped VM's snapshot still
    uses as its qcow2 backing file is not detectable here, hence an explicit command with
    `--keep` rather than anything automatic.
    """
    named = {p.resolve() for p in (root / "names").glob("*") if p.is_symlink()}
    images = sorted(entries(root), key=lambda d: (d / MANIFEST).stat().st_mtime, reverse=True)
    busy = open_files()
    removed = []
    for d in images[keep:]:
        if d.resolve() in named or any(f.startswith(str(d) + "/") for f in busy):
            continue
        removed.append(d)
        if not dry_run:
            shutil.rmtree(d, ignore_errors=True)
    if not dry_run:
        for link in (root / RECIPES).glob("*") if (root / RECIPES).is_dir() else ():
            if link.is_symlink() and not link.exists():
                link.unlink()  # its entry is gone: the recipe builds again when asked
    return removed
