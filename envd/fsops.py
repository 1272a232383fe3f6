"""The filesystem operations behind /files and filesystem.Filesystem, as plain functions.

They follow E2B's envd: the work is done with envd's rights (root in the guest), and what
a request creates — an uploaded file, every parent directory made for it, MakeDir's
directories, Move's new parents — is given to the requesting user (their uid and primary
gid), as is a file an upload overwrites. So `files.write("/solution/solve.sh", …)` as the
default `user` works, as on E2B, and the file is `user`'s; the kernel's checks still bind
the user's processes (`envd.procs` drops to the user). E2B's users have passwordless sudo,
so envd reading or writing a path the user could not is no new power.

Ownership is given only when envd runs as root: as anyone else (envd on a host, in tests)
it cannot give files away, and what it creates is already its own user's — the user of
every request there (`users.lookup_or_current`).

Most of these are a few syscalls on one inode and run in envd itself. The ones that walk
a tree (`list_dir`, `remove_tree`, `move_across`) are meant for `envd.offload`'s child:
they raise `OSError` only and return JSON-able values.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

from envd import wire
from envd.users import User

DIR_MODE = 0o755
FILE_MODE = 0o666  # E2B's OpenFile mode; envd's umask (022 in the guest) makes it 0644


class ParentError(OSError):
    """A missing parent of an upload could not be made (a file in the way, a read-only
    filesystem): E2B's "error ensuring directories", a 500, not the client's mistake."""


def give(target: str | int, user: User) -> None:
    """chown `target` (a path, or an open descriptor) to `user` when envd may."""
    if os.geteuid() == 0:
        os.chown(target, user.uid, user.gid)


def ensure_dirs(path: str, user: User) -> None:
    """mkdir -p `path`, each directory it creates owned by `user` (E2B's EnsureDirs: the
    ones that exist keep their owner). A non-directory on the way is ENOTDIR."""
    missing: list[str] = []
    current = os.path.normpath(path)
    while not os.path.isdir(current):
        if os.path.lexists(current) and not os.path.islink(current):
            raise NotADirectoryError(errno.ENOTDIR, "path is a file", current)
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise NotADirectoryError(errno.ENOTDIR, "path is a file", directory) from None
        # also when another request made it meanwhile: it may not have chowned it yet
        give(directory, user)


def open_read(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def create_file(path: str, user: User) -> int:
    """Open `path` for writing, truncated, and `user`'s, in the steps and order of E2B's
    upload (processFile), which a watcher of the directory sees: parents made (ParentError
    if they cannot be), then an existing file chowned by path before it is truncated
    (CHMOD, WRITE), a new one created and then chowned (CREATE, CHMOD); the data's WRITE
    follows. IsADirectoryError when `path` is a directory."""
    try:
        ensure_dirs(os.path.dirname(path) or "/", user)
    except OSError as e:
        raise ParentError(e.errno, e.strerror, e.filename) from e
    chowned = False
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            raise IsADirectoryError(errno.EISDIR, "path is a directory", path)
        give(path, user)
        chowned = True
    except FileNotFoundError:  # new (or removed meanwhile): chowned once open
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    if not chowned:
        try:
            give(fd, user)
        except OSError:
            os.close(fd)
            raise
    return fd


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
        if top:  # the directory asked for must be readable
            raise
        return  # a subdirectory that cannot be read (a FUSE mount, say): listed, not entered
    for child in children:
        try:
            st = child.stat(follow_symlinks=False)
            out.append(wire.entry_info(child.path, st))
        except OSError:
            continue
        if depth > 1 and stat.S_ISDIR(st.st_mode):
            _walk(child.path, depth - 1, out)


def make_dir(path: str, user: User) -> dict[str, Any]:
    """mkdir -p, the new directories `user`'s; `{"exists": "dir" | "other"}` when something
    is already there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        pass
    else:
        return {"exists": "dir" if stat.S_ISDIR(st.st_mode) else "other"}
    ensure_dirs(path, user)
    return {"entry": wire.entry_info(path)}


def move(src: str, dst: str, user: User) -> dict[str, Any]:
    """Rename `src` to `dst`, its missing parents made `user`'s. EXDEV (another filesystem)
    is the caller's to handle, with `move_across` in a child."""
    if not os.path.lexists(src):
        raise FileNotFoundError(errno.ENOENT, "source not found", src)
    ensure_dirs(os.path.dirname(dst) or "/", user)
    os.rename(src, dst)
    return wire.entry_info(dst)


def move_across(src: str, dst: str) -> dict[str, Any]:
    """A move across filesystems: copy, then delete (the copies keep modes, not owners)."""
    import shutil  # envd imports what it needs when it needs it (start-up time)

    shutil.move(src, dst)
    return wire.entry_info(dst)


def remove(path: str) -> bool:
    """rm of anything but a directory; False for a directory, whose tree the caller removes
    with `remove_tree` in a child. A missing path is not an error (envd uses RemoveAll)."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        os.unlink(path)
    except FileNotFoundError:
        pass
    return True


def remove_tree(path: str) -> None:
    import shutil

    try:
        shutil.rmtree(path)
    except FileNotFoundError:  # removed meanwhile: RemoveAll's answer too
        return


def is_dir(path: str) -> bool:
    """Whether `path` is a directory (following links); raises what stat raises."""
    return stat.S_ISDIR(os.stat(path).st_mode)
