"""What turns one tree's ext4 into the next tree's: a `debugfs -w` script from two trees.

A layer chain's trees share inodes (`oci_chains`: each chain's tree is a hard-linked copy
of its parent's, and unpacking and injection never write into an existing file: they
unlink and create). So an entry whose inode is the same in both trees is unchanged, and
what a layer (whiteouts, opaque directories, hard links) or the guest injection did is
read off the two trees by one walk each: the semantics stay those of `oci_apply` and
`inject`, written once. Directories are copied, never linked: they are compared by kind,
mode, owner and extended attributes (their mtimes are the host's unpack time, as in a
fresh mkfs).

The script keeps a small layer's writes together on disk: everything that goes is first
moved aside (`ln` into a trash directory in `lost+found`, `unlink`: no block is freed yet;
`dirblocks` also moves the changed directories' blocks and keeps holes clear), every new
file is written (libext2fs allocates first-fit from its flex group's start, so new data
lands past the parent's data, not in holes this layer frees), and only then is the trash
removed. Link counts: `ln` and `unlink` leave them as they are, `rm` and `rmdir`
decrement, so a link added to an inode sets its count to its final names plus those
still in the trash.

`plan` is pure (two `snapshot`s in, commands out); `snapshot` walks a tree.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Entry", "Plan", "Tree", "Unsupported", "plan", "quoted", "snapshot"]

#: The directory the script moves what goes into (absent from the image when it ends).
TRASH = ".aenv-layer-trash"
#: Where the trash goes: mkfs makes it (empty, its blocks among the first), and an image
#: tree has none, so entries there touch no directory of the image's.
SCRATCH = "lost+found"


class Unsupported(Exception):
    """The two trees cannot be bridged by the script (a name debugfs cannot quote, a
    socket): the caller makes the disk afresh."""


@dataclass(frozen=True)
class Entry:
    """One name in a tree, as far as its ext4 inode goes."""

    kind: str  # dir, file, link, fifo, chr, blk, sock
    ino: int
    mode: int  # permission bits (07777)
    uid: int
    gid: int
    mtime: int
    rdev: int = 0
    target: str = ""  # a symlink's
    xattrs: tuple[tuple[str, bytes], ...] = ()  # directories only: files' are read when written


#: relative '/'-separated path ("" is the root) → entry
Tree = dict[str, Entry]

_KINDS = {
    stat.S_IFDIR: "dir",
    stat.S_IFREG: "file",
    stat.S_IFLNK: "link",
    stat.S_IFIFO: "fifo",
    stat.S_IFCHR: "chr",
    stat.S_IFBLK: "blk",
    stat.S_IFSOCK: "sock",
}
_TYPE_BITS = {v: k for k, v in _KINDS.items()}


def xattrs_of(path: Path | str) -> tuple[tuple[str, bytes], ...]:
    """A name's extended attributes, sorted (none where the host keeps none)."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return ()
    out = []
    for name in sorted(names):
        try:
            out.append((name, os.getxattr(path, name, follow_symlinks=False)))
        except OSError:
            continue
    return tuple(out)


def _entry(path: str, st: os.stat_result) -> Entry:
    kind = _KINDS.get(stat.S_IFMT(st.st_mode), "sock")
    return Entry(
        kind=kind,
        ino=st.st_ino,
        mode=stat.S_IMODE(st.st_mode),
        uid=st.st_uid,
        gid=st.st_gid,
        mtime=int(st.st_mtime),
        rdev=st.st_rdev if kind in ("chr", "blk") else 0,
        target=os.readlink(path) if kind == "link" else "",
        xattrs=xattrs_of(path) if kind == "dir" else (),
    )


def snapshot(root: Path) -> Tree:
    """Every name under `root` (symlinks not followed), the root as ""."""
    tree: Tree = {"": _entry(str(root), os.lstat(root))}
    stack = [("", str(root))]
    while stack:
        rel, host = stack.pop()
        with os.scandir(host) as it:
            for d in it:
                name = f"{rel}/{d.name}" if rel else d.name
                e = _entry(d.path, d.stat(follow_symlinks=False))
                tree[name] = e
                if e.kind == "dir":
                    stack.append((name, d.path))
    return tree


@dataclass
class Plan:
    """The debugfs commands (one a line) and what they amount to."""

    commands: list[str] = field(default_factory=list)
    #: new regular files written, and their bytes (apparent sizes)
    written: int = 0
    written_bytes: int = 0
    removed: int = 0  # names that go (whole subtrees counted once)
    #: (path in the image, its xattrs) to set after the file is written: the caller reads
    #: them from the host and renders `ea_set` (values are bytes, not script text)
    xattrs: list[tuple[str, tuple[tuple[str, bytes], ...]]] = field(default_factory=list)
    #: directories both trees have whose names change (their blocks get rewritten)
    touched: set[str] = field(default_factory=set)
    #: the trash directory's path (neither tree has it, nor names starting with it)
    trash: str = f"{SCRATCH}/{TRASH}"


def quoted(rel: str) -> str:
    """A tree's relative name as an absolute debugfs argument."""
    return _q(_abs(rel))


def _q(path: str) -> str:
    """A name as a debugfs argument: double-quoted (its parser splits on blanks)."""
    if any(c in path for c in '"\n\r\t\\') or any(ord(c) < 32 for c in path):
        raise Unsupported(f"a name debugfs cannot quote: {path!r}")
    return f'"{path}"'


def _abs(rel: str) -> str:
    return "/" + rel


def _parent(rel: str) -> tuple[str, str]:
    head, _, name = rel.rpartition("/")
    return head, name


def _depth_key(rel: str) -> tuple[str, ...]:
    return tuple(rel.split("/"))


def _same(rel: str, before: Tree, after: Tree) -> bool:
    b, a = before.get(rel), after.get(rel)
    if b is None or a is None or b.kind != a.kind:
        return False
    return a.kind == "dir" or a.ino == b.ino


def plan(
    before: Tree,
    after: Tree,
    source: Callable[[str], str],
    size_of: Callable[[str], int] = lambda rel: 0,
) -> Plan:
    """The commands that turn the ext4 of `before` into one of `after`. `source(rel)`:
    the host path a new regular file is written from; `size_of(rel)` its size (counted)."""
    out = Plan()
    if SCRATCH in before or SCRATCH in after:
        trash = TRASH  # at the root, then, under a name no entry there starts with
        while any(p.startswith(trash) for p in (*before, *after) if "/" not in p):
            trash = "." + trash
        out.touched.add("")
    else:
        trash = f"{SCRATCH}/{TRASH}"
    out.trash = trash
    out.commands.append(f"mkdir {_q(_abs(trash))}")
    where = _move_aside(before, after, trash, out)
    _create(before, after, where, out, source, size_of)
    _kept_dirs(before, after, out)
    for p in sorted(where, key=_depth_key, reverse=True):  # files first, dirs bottom up
        out.commands.append(f"{'rmdir' if before[p].kind == 'dir' else 'rm'} {_q(_abs(where[p]))}")
    out.commands.append(f"rmdir {_q(_abs(trash))}")
    return out


def _move_aside(before: Tree, after: Tree, trash: str, out: Plan) -> dict[str, str]:
    """Move the topmost name of each subtree that goes into the trash (nothing freed
    yet); where each name that goes is now."""
    where: dict[str, str] = {}
    for p in sorted((p for p in before if p and not _same(p, before, after)), key=_depth_key):
        head, name = _parent(p)
        if head in where:  # inside a directory moved already
            where[p] = f"{where[head]}/{name}"
            continue
        where[p] = f"{trash}/{out.removed}"
        out.removed += 1
        out.touched.add(head)
        out.commands.append(f"ln {_q(_abs(p))} {_q(_abs(where[p]))}")
        out.commands.append(f"unlink {_q(_abs(p))}")
    return where


def _create(
    before: Tree,
    after: Tree,
    where: dict[str, str],
    out: Plan,
    source: Callable[[str], str],
    size_of: Callable[[str], int],
) -> None:
    """Write what is new, parents first; link extra names of one inode; fix link counts."""
    cmd = out.commands.append
    # where each inode of the parent's disk is reachable now, and how many of its names
    # wait in the trash (each `rm` of one will decrement its count)
    reach: dict[int, str] = {}
    trashed: dict[int, int] = {}
    for p, e in before.items():
        if e.kind == "dir" or not p:
            continue
        if p in where:
            trashed[e.ino] = trashed.get(e.ino, 0) + 1
            reach.setdefault(e.ino, where[p])
        else:
            reach[e.ino] = p  # a kept name is the better one
    names: dict[int, int] = {}
    for p, e in after.items():
        if e.kind != "dir" and p:
            names[e.ino] = names.get(e.ino, 0) + 1
    linked: set[int] = set()
    cwd = None
    for p in sorted((p for p in after if p and not _same(p, before, after)), key=_depth_key):
        e = after[p]
        head, name = _parent(p)
        if _same(head, before, after) or not head:
            out.touched.add(head)
        if cwd != head:
            cmd(f"cd {_q(_abs(head))}")
            cwd = head
        if e.kind != "dir" and e.ino in reach:  # another name of an inode already there
            cmd(f"ln {_q(_abs(reach[e.ino]))} {_q(name)}")
            linked.add(e.ino)
            continue
        cmd(_make(p, name, e, source))
        if e.kind == "file":
            out.written += 1
            out.written_bytes += size_of(p)
        _meta(cmd, p, e, with_times=e.kind != "dir")
        if e.kind != "dir":
            reach[e.ino] = p
            if names[e.ino] > 1:
                linked.add(e.ino)
        out.xattrs.append((p, e.xattrs))  # directories' known; files' read by the caller
    if cwd is not None:
        cmd("cd /")
    for ino in sorted(linked):
        cmd(f"sif {_q(_abs(reach[ino]))} links_count {names[ino] + trashed.get(ino, 0)}")


def _make(rel: str, name: str, e: Entry, source: Callable[[str], str]) -> str:
    """The command that creates `name` (in the current directory) as `e`."""
    if e.kind == "dir":
        return f"mkdir {_q(name)}"
    if e.kind == "file":
        return f"write {_q(source(rel))} {_q(name)}"
    if e.kind == "link":
        if not e.target:
            raise Unsupported(f"an empty symlink target: {rel!r}")
        return f"symlink {_q(name)} {_q(e.target)}"
    if e.kind == "fifo":
        return f"mknod {_q(name)} p"
    if e.kind in ("chr", "blk"):
        t = "c" if e.kind == "chr" else "b"
        return f"mknod {_q(name)} {t} {os.major(e.rdev)} {os.minor(e.rdev)}"
    raise Unsupported(f"a socket in the image: {rel!r}")


def _kept_dirs(before: Tree, after: Tree, out: Plan) -> None:
    """Directories in both trees whose mode, owner or attributes changed."""
    for p, a in after.items():
        b = before.get(p)
        if b is None or a.kind != "dir" or b.kind != "dir":
            continue
        if (a.mode, a.uid, a.gid) != (b.mode, b.uid, b.gid):
            _meta(out.commands.append, p, a, with_times=False)
        if a.xattrs != b.xattrs:
            for name, _ in b.xattrs:
                if name not in dict(a.xattrs):
                    out.commands.append(f"ea_rm {_q(_abs(p))} {_q(name)}")
            out.xattrs.append((p, a.xattrs))


def _meta(cmd: Callable[[str], None], rel: str, e: Entry, *, with_times: bool) -> None:
    path = _q(_abs(rel))
    cmd(f"sif {path} mode {_TYPE_BITS[e.kind] | e.mode}")
    cmd(f"sif {path} uid {e.uid}")
    cmd(f"sif {path} gid {e.gid}")
    if with_times:
        for field_ in ("mtime", "atime", "ctime"):
            cmd(f"sif {path} {field_} @{e.mtime}")
