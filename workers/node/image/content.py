"""What a disk in the cache *is*: its content digest (`shared/diskdigest.py`), as recorded in
its directory's `manifest.json`, so a capture can say which bytes its qcow2 layers were
written over and another node can refuse to stack them on other bytes (issue 40: two
builds of one recipe are two different ext4 filesystems).

A disk built before the digest was recorded (or one whose file changed since: its inode,
size or mtime differ from the stamp taken with the digest) is hashed here once, and the
digest recorded, so every image a node runs a VM over has one. Blocking: ~2 s for the base
image the first time, a manifest read after; call it from a thread off the event loop.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from shared.diskdigest import chunk_list
from shared.lazybase import LAZY_ROOT

from . import cache as _cache

__all__ = ["content_of", "disk_stamp", "recipe_of", "recorded_content"]

MANIFEST = "manifest.json"


def disk_stamp(disk: Path) -> list[int]:
    """(inode, size, mtime ns): recorded beside a digest; a disk whose stamp differs since is
    hashed again before a capture is stacked on it (it may have been rebuilt or copied)."""
    st = os.stat(disk)
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _read(disk: Path) -> dict[str, Any]:
    try:
        doc = json.loads((disk.parent / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _valid(doc: dict[str, Any], disk: Path) -> str | None:
    content = doc.get("content")
    if not isinstance(content, dict) or not content.get("digest"):
        return None
    stamp = content.get("stamp")
    if stamp is not None and stamp != disk_stamp(disk):
        return None  # the file changed since it was hashed
    return str(content["digest"])


def recipe_of(disk: Path) -> str:
    """The recipe a cache entry's disk was built from (its manifest's `digest`): what a
    capture names so another node finds its own build of it. A disk outside the cache
    (or from before content keys) is named by its directory, as it always was."""
    recipe = _read(disk).get("digest")
    return str(recipe) if recipe else disk.parent.name.removeprefix("runtime-")


def recorded_content(disk: Path) -> str | None:
    """The disk's recorded content digest, None if none is recorded (or it is stale)."""
    return _valid(_read(disk), disk)


def content_of(disk: Path) -> str:
    """The disk's content digest: the recorded one, else hashed now and recorded in its
    directory's manifest (under the entry's cache lock, written atomically); a disk outside
    the cache (no manifest beside it: a test's) is hashed every time. Remembered in the
    process while neither the disk nor its manifest changed: a capture (the pause path)
    pays two stats, not the parse of a chunk list."""
    if disk.name == LAZY_ROOT:  # a lazy base's stub: its bytes are not the image's
        return _lazy_content(disk)
    if not (disk.parent / MANIFEST).is_file():  # not a cache entry: nowhere to record it
        return chunk_list(disk).digest
    key = _memo_key(disk)
    if key in _memo:
        return _memo[key]
    found = recorded_content(disk) or _hash_and_record(disk)
    _memo[_memo_key(disk)] = found
    return found


def _lazy_content(stub: Path) -> str:
    """The content a lazy base's stub stands for: its entry's recorded digest, never a hash
    of the stub (a few headers) nor a stamp check (a whole copy fetched into the entry
    later rewrites the manifest with its own file's stamp)."""
    digest = (_read(stub).get("content") or {}).get("digest")
    if not digest:
        raise OSError(f"{stub}: its entry records no content digest")
    return str(digest)


#: (disk, its stamp, its manifest's inode and mtime) -> content digest
_memo: dict[tuple[object, ...], str] = {}


def _memo_key(disk: Path) -> tuple[object, ...]:
    manifest = os.stat(disk.parent / MANIFEST)
    return (str(disk), *disk_stamp(disk), manifest.st_ino, manifest.st_mtime_ns)


def _hash_and_record(disk: Path) -> str:
    root, key = _cache.lock_of(disk.parent)
    with _cache.locked(root, key):
        doc = _read(disk)
        found = _valid(doc, disk)
        if found is not None:  # another thread or node hashed it meanwhile
            return found
        stamp = disk_stamp(disk)
        chunks = chunk_list(disk)
        if stamp != disk_stamp(disk):
            raise OSError(f"{disk} changed while it was hashed")
        doc["content"] = {"digest": chunks.digest, **chunks.as_json(), "stamp": stamp}
        tmp = disk.parent / f".{MANIFEST}.{os.getpid()}"
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, disk.parent / MANIFEST)
        return chunks.digest
