"""The on-disk image cache: content-addressed directories, built aside, published by rename.

Layout under the cache root (default /var/lib/aenv/images, env AENV_IMAGE_CACHE):
    <digest>/{vmlinux, initrd.cpio, root.ext4, manifest.json}   a complete image
    kernel-<release>-<version>/{vmlinux, modules/, kernel.json} shared kernel (vmlinux is
                                                               hard-linked into images)
    rootfs-<digest>/                                           cached debootstrap tree
    names/<name> -> ../<digest>                                images built under a name
    .locks/<key>.lock                                          flock per cache entry
    .tmp-<key>-*                                               builds in progress
A directory named by a digest only ever appears complete: it is assembled in a `.tmp-`
sibling and renamed into place while holding that key's lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
def locked(root: Path, key: str) -> Iterator[None]:
    """Hold an exclusive flock for `key` (blocks while another builder holds it).

    Also clears `.tmp-<key>-*` leftovers (and anything mounted in them): whoever left
    them died holding this lock.
    """
    locks = root / ".locks"
    locks.mkdir(exist_ok=True)
    with (locks / f"{key}.lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            for stale in root.glob(f".tmp-{key}-*"):
                # a killed debootstrap may have left /proc etc. mounted in there:
                # detach first, or rmtree would walk into them
                unmount_under(stale)
                shutil.rmtree(stale, ignore_errors=True)
            yield
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


def publish(tmp: Path, final: Path) -> None:
    """Move a finished build into place, replacing an older one (a forced rebuild)."""
    if final.exists():
        old = final.with_name(f".tmp-old-{final.name}-{os.getpid()}")
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)


def link_name(root: Path, name: str, digest: str) -> None:
    """Point `names/<name>` at an image digest (atomically replacing an older target)."""
    names = root / "names"
    names.mkdir(exist_ok=True)
    tmp = names / f".{name}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(f"../{digest}")
    os.replace(tmp, names / name)


def _open_files() -> set[str]:
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
    named = {p.resolve().name for p in (root / "names").glob("*") if p.is_symlink()}
    images = sorted(
        (d for d in root.iterdir() if d.is_dir() and (d / "manifest.json").is_file()),
        key=lambda d: (d / "manifest.json").stat().st_mtime,
        reverse=True,
    )
    busy = _open_files()
    removed = []
    for d in images[keep:]:
        if d.name in named or any(f.startswith(str(d) + "/") for f in busy):
            continue
        removed.append(d)
        if not dry_run:
            shutil.rmtree(d, ignore_errors=True)
    return removed
