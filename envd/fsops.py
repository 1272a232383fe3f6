"""The filesystem operations behind /files and filesystem.Filesystem, as plain functions.

Each runs as the requesting user (`envd.asuser`): in a child that became that user, so
the kernel checks every permission, and what they create is the user's without a chown.
They raise `OSError` only (the errno crosses back to envd) and return JSON-able values or,
for the `open_*` ones, a file descriptor.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

from envd import wire

DIR_MODE = 0o755
FILE_MODE = 0o644


def open_read(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def create_file(path: str) -> int:
    """Open `path` for writing, truncated; its missing parents are created first."""
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, DIR_MODE, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)


def entry(path: str) -> dict[str, Any]:
    return wire.entry_info(path)


def list_dir(path: str, depth: int) -> list[dict[str, Any]]:
    """EntryInfo of everything under the directory `path`, down to `depth` levels."""
    if not stat.S_ISDIR(os.stat(path).st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
    out: list[dict[str, Any]] = []
    _walk(path, depth, out, top=True)
    return out


def _walk(directory: str, depth: int, out: list[dict[str, Any]], top: bool = False) -> None:
    try:
        with os.scandir(directory) as it:
            children = sorted(it, key=lambda e: e.name)
    except OSError:
        if top:  # the directory asked for: the user must be able to read it
            raise
        return  # a subdirectory the user may not read: listed, not entered
    for child in children:
        try:
            st = child.stat(follow_symlinks=False)
            out.append(wire.entry_info(child.path, st))
        except OSError:
            continue
        if depth > 1 and stat.S_ISDIR(st.st_mode):
            _walk(child.path, depth - 1, out)


def make_dir(path: str) -> dict[str, Any]:
    """mkdir -p; `{"exists": "dir" | "other"}` when something is already there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        pass
    else:
        return {"exists": "dir" if stat.S_ISDIR(st.st_mode) else "other"}
    os.makedirs(path, DIR_MODE, exist_ok=True)
    return {"entry": wire.entry_info(path)}


def move(src: str, dst: str) -> dict[str, Any]:
    """Rename `src` to `dst` (its parents created; across filesystems: copy, then delete)."""
    if not os.path.lexists(src):
        raise FileNotFoundError(errno.ENOENT, "source not found", src)
    parent = os.path.dirname(dst)
    if parent:
        os.makedirs(parent, DIR_MODE, exist_ok=True)
    try:
        os.rename(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        import shutil  # envd imports what it needs when it needs it (start-up time)

        shutil.move(src, dst)
    return wire.entry_info(dst)


def remove(path: str) -> None:
    """rm -rf: a missing path is not an error (envd uses RemoveAll)."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            import shutil

            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def check_watchable(path: str) -> bool:
    """Whether `path` is a directory the user may list (what watching it shows); raises
    what opening it raises."""
    if not stat.S_ISDIR(os.stat(path).st_mode):
        return False
    os.close(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
    return True
