"""Path handling inside a guest root tree that we write to as host root.

An image's tree is untrusted: `etc` may be a symlink to `/etc` of the host, a layer entry
may be named `../../x`. Every write into a tree therefore goes through `resolve_in_root`,
which follows symlinks the way they would resolve *inside the guest* (absolute targets and
`..` are clamped to the tree's root), so nothing lands outside it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path, PurePosixPath

from .errors import ImageError

_MAX_SYMLINKS = 40


def split_member_name(name: str) -> list[str]:
    """Components of an archive member name relative to the root; reject `..` traversal.

    Leading `/` and `./` are tolerated (tar writers differ); a `..` component is not, since
    no honest image needs one and clamping would silently write somewhere unexpected.
    """
    parts = [p for p in PurePosixPath(name).parts if p not in ("/", ".", "")]
    if any(p == ".." for p in parts):
        raise ImageError(f"path traversal in archive member {name!r}")
    return parts


def resolve_in_root(root: Path, parts: list[str], *, follow_last: bool = False) -> Path:
    """Host path of `parts` inside `root`, following symlinks as the guest would.

    Symlinks in the parent components are followed (clamped to `root`); the last component
    is followed only if `follow_last`, because callers usually replace it.
    """
    resolved: list[str] = []
    pending = list(parts)
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        is_last = not pending
        if (not is_last or follow_last) and candidate.is_symlink():
            hops += 1
            if hops > _MAX_SYMLINKS:
                raise ImageError(f"too many symlinks resolving /{'/'.join(parts)}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            pending = [p for p in target.split("/") if p] + pending
            continue
        resolved.append(part)
    return root.joinpath(*resolved)


def guest_path(root: Path, path: str, *, follow_last: bool = False) -> Path:
    """`resolve_in_root` for a guest path written as a string (`/etc/hosts`)."""
    return resolve_in_root(root, [p for p in path.split("/") if p], follow_last=follow_last)


def remove_any(path: Path) -> None:
    """Remove a file, symlink or whole directory tree; absent is fine."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def write_guest_file(
    root: Path, path: str, data: bytes, *, mode: int = 0o644, uid: int = 0, gid: int = 0
) -> Path:
    """Write a regular file at guest `path`, replacing whatever (symlink, dir) was there."""
    target = guest_path(root, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_any(target)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(target, mode)
    if os.geteuid() == 0:
        os.lchown(target, uid, gid)
    return target


def guest_mkdir(root: Path, path: str, *, mode: int = 0o755, uid: int = 0, gid: int = 0) -> Path:
    """Ensure a directory at guest `path` (replacing a non-directory there)."""
    target = guest_path(root, path, follow_last=True)
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        remove_any(target)
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.mkdir(mode=mode)
        os.chmod(target, mode)
        if os.geteuid() == 0:
            os.lchown(target, uid, gid)
    return target


def unmount_under(path: Path) -> list[str]:
    """Lazily unmount anything mounted at or below `path` (debootstrap can leave /proc).

    Returns the mount points it detached, deepest first, for the caller to report.
    """
    prefix = str(path.resolve())
    points = []
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 2:
                continue
            mnt = fields[1].replace("\\040", " ")
            if mnt == prefix or mnt.startswith(prefix + "/"):
                points.append(mnt)
    for mnt in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", mnt], check=False, capture_output=True)
    return points
