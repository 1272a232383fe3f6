"""Removal that a crash cannot leave half done (issue 42): an entry's directory is renamed
aside (`.gone-<name>`, atomic, on the same filesystem) and only then deleted. A kill
mid-delete leaves a `.gone-` name, which nothing takes for an entry and `sweep` removes;
never a half tree under the entry's own name (an image dir without its manifest was
listed by nobody and counted by every walk, for ever).

`sweep` also removes what older code or a dead builder left: image dirs without a
manifest (the removal used to unlink it first, then rmtree), and `.tmp-<key>-*` build
scratch whose builder died, each under its key's lock and only if no one holds it (a
build that holds it may be writing there).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Collection
from pathlib import Path

from workers.node.image import cache as _cache
from workers.node.image.fsutil import unmount_under

__all__ = ["GONE", "gone_aside", "parents", "sweep", "sweep_gone"]

#: the prefix of an entry renamed aside for deletion
GONE = ".gone-"


def gone_aside(path: Path) -> Path | None:
    """Rename a directory to its `.gone-` name (an older one of that name, left by a
    kill, is deleted first); None if it was not there."""
    gone = path.with_name(GONE + path.name)
    for _ in range(2):
        try:
            os.rename(path, gone)
            return gone
        except FileNotFoundError:
            return None
        except OSError:  # ENOTEMPTY/EEXIST: a leftover of the same name
            shutil.rmtree(gone, ignore_errors=True)
    return None


def sweep_gone(dirs: Collection[Path], busy: Collection[Path] = ()) -> None:
    """Delete every `.gone-*` under these directories but those being deleted now."""
    for parent in dirs:
        for d in _names(parent):
            if d.name.startswith(GONE) and d not in busy:
                shutil.rmtree(d, ignore_errors=True)


def sweep(root: Path, busy: Collection[Path] = ()) -> None:
    """What a kill left in the image cache `root`: `.gone-*`, image dirs without their
    manifest, dead builders' `.tmp-*` (a key someone holds is left alone)."""
    sweep_gone(parents(root), busy)
    for d in _names(root / _cache.IMAGES):
        if d.name.startswith(".") or not d.is_dir() or (d / _cache.MANIFEST).exists():
            continue
        with _cache.locked(*_cache.lock_of(d), wait=False) as held:
            if held and not (d / _cache.MANIFEST).exists():
                gone = gone_aside(d)
                if gone is not None and (gone / _cache.MANIFEST).exists():
                    # a build published there meanwhile (it holds its recipe's lock, not
                    # this one): put it back
                    with contextlib.suppress(OSError):
                        os.rename(gone, d)
                    continue
                if gone is not None:
                    shutil.rmtree(gone, ignore_errors=True)
    for d in _names(root):
        if d.name.startswith(".tmp-") and d.is_dir() and _unheld(root, d.name[5:]):
            unmount_under(d)  # a killed debootstrap may have left /proc mounted in it
            shutil.rmtree(d, ignore_errors=True)


def _unheld(root: Path, rest: str) -> bool:
    """Whether no one holds a lock whose key `.tmp-<key>-*` could name this scratch: each
    dash-prefix of `rest` (a kernel's `.tmp-kernel-<release>-...` is made under the lock
    `kernel`, an image's under its digest's). A live builder holds its key for as long as
    its scratch lives, so unheld means its maker died; one that takes the key meanwhile
    makes a scratch of another name. Tried without waiting, and without taking it through
    `cache.locked` (which would clear every `.tmp-<prefix>-*`, live ones included)."""
    parts = rest.split("-")
    for n in range(1, len(parts)):
        lock = root / ".locks" / f"{'-'.join(parts[:n])}.lock"
        if not lock.exists():
            continue  # never taken: no one holds it
        try:
            with lock.open("a") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on close
        except BlockingIOError:
            return False
        except OSError:
            continue
    return True


def parents(root: Path) -> list[Path]:
    """The directories of an image cache that hold entries (and so `.gone-` names)."""
    return [root / _cache.IMAGES, root / "layers", root / "oci", root]


def _names(directory: Path) -> list[Path]:
    with contextlib.suppress(OSError):
        return sorted(directory.iterdir())
    return []
