"""One uncompressed OCI layer applied onto a root tree, the way container runtimes do:
its whiteouts (`.wh.<name>`, opaque `.wh..wh..opq`) first remove what lower layers put
there, then its entries are written with their numeric ownership, modes and xattrs.

The layer is untrusted: every path resolves inside the tree (`fsutil`), files are created
with O_EXCL|O_NOFOLLOW, and devices are made only as root (the guest's devtmpfs has /dev).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tarfile
from pathlib import Path
from typing import IO

from .errors import ImageError
from .fsutil import remove_any, resolve_in_root, split_member_name

__all__ = ["OPAQUE", "WHITEOUT", "apply_layer"]

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_CHUNK = 1 << 20


def _apply_whiteouts(members: list[tarfile.TarInfo], root: Path) -> None:
    # whiteouts only hide lower layers, so they all go first, wherever they sit in the tar
    for m in members:
        parts = split_member_name(m.name)
        if not parts or not parts[-1].startswith(WHITEOUT):
            continue
        if parts[-1] == OPAQUE:
            d = resolve_in_root(root, parts[:-1], follow_last=True)
            if d.is_dir() and not d.is_symlink():
                for child in d.iterdir():
                    remove_any(child)
        else:
            remove_any(resolve_in_root(root, [*parts[:-1], parts[-1][len(WHITEOUT) :]]))


def _set_meta(dest: Path, m: tarfile.TarInfo, is_root: bool) -> None:
    if is_root:
        os.lchown(dest, m.uid, m.gid)
    if not m.issym():
        os.chmod(dest, m.mode & 0o7777)  # after chown, which clears setuid bits
    for key, value in m.pax_headers.items():
        if key.startswith("SCHILY.xattr."):
            # e.g. security.selinux on a host without SELinux: not fatal for a sandbox
            with contextlib.suppress(OSError):
                os.setxattr(
                    dest,
                    key[len("SCHILY.xattr.") :],
                    value.encode("utf-8", "surrogateescape"),
                    follow_symlinks=False,
                )
    if not m.isdir():
        os.utime(dest, (m.mtime, m.mtime), follow_symlinks=False)


def _extract(tf: tarfile.TarFile, m: tarfile.TarInfo, root: Path, is_root: bool) -> None:
    parts = split_member_name(m.name)
    if not parts:
        return  # the layer's "./" entry
    dest = resolve_in_root(root, parts)
    if dest.parent != root and not dest.parent.is_dir():
        parent = resolve_in_root(root, parts[:-1], follow_last=True)
        if parent.exists() and not parent.is_dir():
            remove_any(parent)
        parent.mkdir(parents=True, exist_ok=True)
        dest = resolve_in_root(root, parts)
    if m.isdir():
        if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
            remove_any(dest)
        dest.mkdir(exist_ok=True)
    elif m.isreg():
        remove_any(dest)
        src = tf.extractfile(m)
        if src is None:
            raise ImageError(f"cannot read {m.name}")
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(src, out, _CHUNK)
    elif m.issym():
        remove_any(dest)
        os.symlink(m.linkname, dest)
    elif m.islnk():
        target = resolve_in_root(root, split_member_name(m.linkname))
        if not os.path.lexists(target) or (target.is_dir() and not target.is_symlink()):
            raise ImageError(f"hard link {m.name} -> {m.linkname}: no such file in the image")
        if target == dest:
            return
        remove_any(dest)
        os.link(target, dest, follow_symlinks=False)
        return  # a hard link shares the target's inode and metadata
    elif m.ischr() or m.isblk() or m.isfifo():
        remove_any(dest)
        kind = stat.S_IFCHR if m.ischr() else stat.S_IFBLK if m.isblk() else stat.S_IFIFO
        if not is_root and kind != stat.S_IFIFO:
            return  # cannot mknod devices unprivileged; the guest's devtmpfs provides /dev
        os.mknod(dest, kind | 0o600, os.makedev(m.devmajor, m.devminor))
    else:
        return  # sparse/unknown types: nothing a root tree needs
    _set_meta(dest, m, is_root)


def _is_whiteout(m: tarfile.TarInfo) -> bool:
    parts = split_member_name(m.name)
    return bool(parts) and parts[-1].startswith(WHITEOUT)


def apply_layer(tar_file: IO[bytes], root: Path, label: str) -> None:
    """Apply one uncompressed layer tar onto `root` (whiteouts first, then entries).

    Every failure is an ImageError prefixed with `label` (which names the layer digest).
    """
    is_root = os.geteuid() == 0
    member = "?"
    try:
        with tarfile.open(fileobj=tar_file, mode="r:") as tf:
            members = tf.getmembers()
            _apply_whiteouts(members, root)
            for m in members:
                member = m.name
                if not _is_whiteout(m):
                    _extract(tf, m, root, is_root)
    except tarfile.TarError as e:
        raise ImageError(f"{label}: corrupt tar: {e}") from e
    except ImageError as e:
        raise ImageError(f"{label}: {e}") from e
    except OSError as e:
        raise ImageError(f"{label}: cannot write {member}: {e}") from e
