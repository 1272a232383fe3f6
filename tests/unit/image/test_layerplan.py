"""Layers share blocks (issue 29): a layer's debugfs script read off two trees (pure), and
the ext4 it makes from its parent's holding exactly the layer's tree (real debugfs,
e2fsck and `rdump`: whiteouts, opaque directories, hard links, symlinks, a fifo, modes,
owners, xattrs), its bytes the parent's but for what the layer wrote."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from shared.diskdigest import chunk_list
from tests.unit.image.test_oci import d, f, hard, layer, sym
from workers.node.image.layerdisk import ChainDisks, derive
from workers.node.image.layerplan import SCRATCH, TRASH, Entry, Tree, Unsupported, plan
from workers.node.image.oci import open_layout, unpack
from workers.node.image.oci_chains import chain_dir
from workers.node.image.oci_write import write_layout

MiB = 1 << 20

needs_e2fsprogs = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("mkfs.ext4", "debugfs", "e2fsck", "resize2fs")),
    reason="e2fsprogs is not installed",
)


def E(kind: str, ino: int, mode: int = 0o644, **kw: object) -> Entry:
    return Entry(kind=kind, ino=ino, mode=mode, uid=0, gid=0, mtime=1_600_000_000, **kw)  # type: ignore[arg-type]


ROOT = E("dir", 1, 0o755)
BIN = f"{SCRATCH}/{TRASH}"  # the trash: in lost+found, which no image tree has


def _plan(before: Tree, after: Tree) -> list[str]:
    return plan(before, after, lambda rel: f"/src/{rel}").commands


def test_unchanged_trees_need_nothing_but_the_trash_round_trip() -> None:
    tree = {"": ROOT, "etc": E("dir", 2, 0o755), "etc/a": E("file", 10)}
    assert _plan(tree, dict(tree)) == [f'mkdir "/{BIN}"', f'rmdir "/{BIN}"']


def test_a_whiteout_moves_the_file_aside_and_frees_it_last() -> None:
    before = {"": ROOT, "a": E("file", 10), "b": E("file", 11)}
    after = {"": ROOT, "b": E("file", 11)}
    cmds = _plan(before, after)
    assert cmds[1:3] == [f'ln "/a" "/{BIN}/0"', 'unlink "/a"']
    assert cmds[-2:] == [f'rm "/{BIN}/0"', f'rmdir "/{BIN}"']
    assert not any(c.startswith("write") for c in cmds)


def test_a_replaced_file_is_written_after_the_old_one_is_moved_aside() -> None:
    before = {"": ROOT, "bin": E("dir", 2, 0o755), "bin/sh": E("file", 10, 0o755)}
    after = {"": ROOT, "bin": E("dir", 3, 0o755), "bin/sh": E("file", 20, 0o755)}
    cmds = _plan(before, after)
    moved, written, freed = (
        cmds.index(f'ln "/bin/sh" "/{BIN}/0"'),
        cmds.index('write "/src/bin/sh" "sh"'),
        cmds.index(f'rm "/{BIN}/0"'),
    )
    assert moved < written < freed  # new data goes in before any block is freed
    assert 'cd "/bin"' in cmds and f'sif "/bin/sh" mode {stat.S_IFREG | 0o755}' in cmds
    assert 'sif "/bin/sh" mtime @1600000000' in cmds


def test_an_opaque_directory_loses_its_old_children_and_keeps_itself() -> None:
    before = {"": ROOT, "d": E("dir", 2), "d/old": E("file", 10), "d/sub": E("dir", 3)}
    before["d/sub/x"] = E("file", 11)
    after = {"": ROOT, "d": E("dir", 4), "d/new": E("file", 20)}
    cmds = _plan(before, after)
    assert f'ln "/d/old" "/{BIN}/0"' in cmds and f'ln "/d/sub" "/{BIN}/1"' in cmds
    assert not any(c.startswith("unlink") and "/d/sub/x" in c for c in cmds)  # moved whole
    tail = cmds[cmds.index("cd /") :]
    # the subtree goes children first: the file, then its directory
    assert tail.index(f'rm "/{BIN}/1/x"') < tail.index(f'rmdir "/{BIN}/1"')
    assert 'write "/src/d/new" "new"' in cmds
    assert not any(c.startswith("mkdir") and '"d"' in c for c in cmds)


def test_hard_links_new_and_onto_an_inode_the_parent_has() -> None:
    before = {"": ROOT, "a": E("file", 10), "gone": E("file", 10)}
    # a new inode with two names; a new name for inode 10, whose other name went
    after = {"": ROOT, "a": E("file", 10), "n1": E("file", 30), "n2": E("file", 30)}
    after["extra"] = E("file", 10)
    cmds = _plan(before, after)
    assert 'write "/src/n1" "n1"' in cmds and 'ln "/n1" "n2"' in cmds
    assert 'ln "/a" "extra"' in cmds
    # inode 10: two names left plus one in the trash (its rm will decrement)
    assert 'sif "/a" links_count 3' in cmds
    assert 'sif "/n1" links_count 2' in cmds


def test_kinds_dirs_and_metadata() -> None:
    before = {"": ROOT, "etc": E("dir", 2, 0o755)}
    after = {
        "": E("dir", 9, 0o700),
        "etc": E("dir", 3, 0o755),
        "etc/l": E("link", 40, 0o777, target="../x y"),
        "etc/p": E("fifo", 41),
        "new": E("dir", 42, 0o1777),
    }
    cmds = _plan(before, after)
    assert 'symlink "l" "../x y"' in cmds and 'mknod "p" p' in cmds and 'mkdir "new"' in cmds
    assert f'sif "/" mode {stat.S_IFDIR | 0o700}' in cmds
    assert f'sif "/new" mode {stat.S_IFDIR | 0o1777}' in cmds


def test_what_debugfs_cannot_say_is_unsupported() -> None:
    with pytest.raises(Unsupported, match="quote"):
        _plan({"": ROOT}, {"": ROOT, 'a"b': E("file", 3)})
    with pytest.raises(Unsupported, match="socket"):
        _plan({"": ROOT}, {"": ROOT, "s": E("sock", 3)})


def test_the_trash_name_never_collides() -> None:
    # a tree with its own lost+found: the trash goes to the root, under a free name
    after = {"": ROOT, SCRATCH: E("dir", 2), TRASH: E("dir", 3), TRASH + "x": E("file", 4)}
    steps = plan({"": ROOT, SCRATCH: E("dir", 2)}, after, lambda rel: rel)
    assert steps.commands[0] == f'mkdir "/.{TRASH}"' and "" in steps.touched


# -- the real thing ------------------------------------------------------------------------


def _rdump(disk: Path, out: Path) -> Path:
    out.mkdir()
    proc = subprocess.run(
        ["debugfs", "-R", f"rdump / {out}", str(disk)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return out


def _describe(root: Path) -> dict[str, tuple[object, ...]]:
    """Each name: kind, mode, owner, content digest or target, mtime (rdump makes each
    hard link a file of its own: links are checked apart)."""
    out: dict[str, tuple[object, ...]] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel == "lost+found" or rel.startswith(("lost+found/", TRASH)):
            continue
        st = p.lstat()
        what: object = None
        if stat.S_ISREG(st.st_mode):
            what = hashlib.sha256(p.read_bytes()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            what = os.readlink(p)
        elif stat.S_ISFIFO(st.st_mode):
            continue  # rdump skips special files: checked apart
        mtime = int(st.st_mtime) if stat.S_ISREG(st.st_mode) else None
        out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
        out[rel] += (what, mtime)
    return out


def _inode(disk: Path, path: str) -> tuple[int, int]:
    """(inode number, link count) of `path` in the ext4 `disk`."""
    proc = subprocess.run(
        ["debugfs", "-R", f"stat {path}", str(disk)], capture_output=True, text=True
    )
    ino = proc.stdout.split("Inode: ", 1)[1].split()[0]
    links = proc.stdout.split("Links: ", 1)[1].split()[0]
    return int(ino), int(links)


def _layers(root_owned: bool) -> list[bytes]:
    own = {"uid": 1234, "gid": 55} if root_owned else {}
    base = layer(
        d("etc"),
        f("etc/passwd", b"root:x:0:0::/root:/bin/sh\n"),
        f("etc/keep", b"keep me\n", mode=0o600, **own),
        d("usr/bin"),
        f("usr/bin/tool", os.urandom(300_000), mode=0o755),
        hard("usr/bin/tool2", "usr/bin/tool"),
        f("usr/bin/old", b"old\n"),
        d("opt/app/sub"),
        f("opt/app/sub/x", b"x" * 5000),
        f("opt/app/y", b"y\n"),
        sym("usr/bin/sh", "tool"),
        f("var/big", os.urandom(2 * MiB)),
    )
    fifo = tarfile.TarInfo("var/pipe")
    fifo.type = tarfile.FIFOTYPE
    child = layer(
        f("usr/bin/.wh.old", b""),  # a whiteout
        f("opt/app/.wh..wh..opq", b""),  # an opaque directory
        f("opt/app/fresh", b"fresh\n", mode=0o640, **own),
        f("usr/bin/tool", b"a new tool\n", mode=0o750),  # replaced; tool2 keeps the old
        hard("usr/bin/tool3", "usr/bin/tool2"),  # a new name of an inode the parent has
        f("srv/with space/data", os.urandom(600_000)),
        sym("srv/link", "/etc/keep"),
        (fifo, None),
        d("etc", mode=0o750),  # a kept directory's mode changes
    )
    return [base, child]


@needs_e2fsprogs
def test_a_child_disk_holds_its_tree_and_shares_its_parents_bytes(tmp_path: Path) -> None:
    is_root = os.geteuid() == 0
    write_layout(tmp_path / "layout", _layers(is_root))
    cache = tmp_path / "layers"
    work = tmp_path / "work"
    work.mkdir()
    disks = ChainDisks(cache, 64 * MiB, work, print)
    with open_layout(tmp_path / "layout") as lo:
        top = unpack(lo, work / "root", lambda _m: None, cache=cache, disks=disks)
        chains = [p.name for p in sorted(cache.iterdir()) if not p.name.startswith(".")]
    assert top is not None and len(chains) == 2
    child = disks.top(top)
    assert child is not None
    parent_chain = next(c for c in chains if chain_dir(cache, top).name != c)
    parent = disks.path(parent_chain.replace("-", ":", 1))
    assert parent.is_file()

    # every file, directory and symlink, with its bytes, mode, owner and links
    got = _describe(_rdump(child[0], tmp_path / "dump"))
    want = _describe(child[1])
    if not is_root:  # rdump cannot chown: compare without owners
        got = {k: v[:2] + v[4:] for k, v in got.items()}
        want = {k: v[:2] + v[4:] for k, v in want.items()}
    assert got == want
    fifo = subprocess.run(
        ["debugfs", "-R", "stat /var/pipe", str(child[0])], capture_output=True, text=True
    )
    assert "Type: FIFO" in fifo.stdout, fifo.stdout + fifo.stderr
    # tool2 and tool3 are one inode with two names; tool is a new one
    two, three, one = (_inode(child[0], f"/usr/bin/{n}") for n in ("tool2", "tool3", "tool"))
    assert two == three and two[1] == 2 and one[0] != two[0] and one[1] == 1

    # the child's chunks are its parent's but for what the layer wrote (~1 MiB here):
    # the superblock's, the bitmaps' and inode tables', and that data's
    a, b = chunk_list(parent), chunk_list(child[0])
    assert a.size == b.size
    differ = [i for i, (x, y) in enumerate(zip(a.chunks, b.chunks, strict=True)) if x != y]
    assert 0 < len(differ) <= 3, differ


@needs_e2fsprogs
def test_a_child_that_outgrows_its_parent_grows_the_disk(tmp_path: Path) -> None:
    before, after = tmp_path / "before", tmp_path / "after"
    (before / "a").mkdir(parents=True)
    (before / "a" / "f").write_bytes(b"1" * 4096)
    subprocess.run(["cp", "-al", str(before), str(after)], check=True)
    (after / "a" / "big").write_bytes(os.urandom(3 * MiB))
    parent = tmp_path / "p.ext4"
    from workers.node.image.disk import make_ext4

    make_ext4(before, parent, 192 * MiB)
    out = tmp_path / "c.ext4"
    done = derive(parent, before, after, out, 320 * MiB)
    assert done.grown and out.stat().st_size == 320 * MiB
    assert done.written == 1 and done.written_bytes == 3 * MiB
    got = _describe(_rdump(out, tmp_path / "dump"))
    assert got["a/big"][4] == hashlib.sha256((after / "a" / "big").read_bytes()).hexdigest()


@needs_e2fsprogs
def test_directories_a_layer_changes_move_next_to_its_data(tmp_path: Path) -> None:
    """Eight base directories spread over 8 MiB-apart places each gain a file: without
    moving their blocks, each would rewrite a chunk of the base's; moved, the child's
    disk differs from its parent's only in the metadata chunks and its own data's."""
    before, after = tmp_path / "before", tmp_path / "after"
    for i in range(8):
        d = before / f"d{i}"
        d.mkdir(parents=True)
        (d / "fill").write_bytes(os.urandom(8 * MiB))  # mkfs -d: d{i+1}'s block 8 MiB on
    subprocess.run(["cp", "-al", str(before), str(after)], check=True)
    for i in range(8):
        (after / f"d{i}" / "new").write_bytes(os.urandom(10_000))
    from workers.node.image.disk import make_ext4

    parent = tmp_path / "p.ext4"
    make_ext4(before, parent, 512 * MiB)
    out = tmp_path / "c.ext4"
    done = derive(parent, before, after, out, 512 * MiB)
    assert done.moved_dirs == 8 and done.written == 8
    a, b = chunk_list(parent), chunk_list(out)
    differ = [i for i, (x, y) in enumerate(zip(a.chunks, b.chunks, strict=True)) if x != y]
    assert len(differ) <= 3, differ  # superblock + bitmaps/inode tables, and the new data
    got = _describe(_rdump(out, tmp_path / "dump"))
    for i in range(8):
        new = after / f"d{i}" / "new"
        assert got[f"d{i}/new"][4] == hashlib.sha256(new.read_bytes()).hexdigest()


def test_the_frontier_is_the_first_free_run_of_a_chunk() -> None:
    from workers.node.image.dirblocks import frontier

    runs = [(100, 3), (200, 1), (300, 1024), (5000, 99999)]
    assert frontier(runs, 4096) == (300, 4)  # 1024 blocks of 4 KiB: 4 MiB
    assert frontier(runs, 1024) == (5000, 1028)  # 1 KiB blocks: 4 MiB is 4096 of them
    assert frontier([(1, 2)], 4096) == (0, 0)  # no room anywhere: nothing kept clear


@needs_e2fsprogs
def test_a_tree_with_its_own_lost_and_found_uses_the_root_as_scratch(tmp_path: Path) -> None:
    before, after = tmp_path / "before", tmp_path / "after"
    (before / "lost+found").mkdir(parents=True)
    (before / "etc").mkdir()
    (before / "etc" / "a").write_bytes(b"a\n")
    subprocess.run(["cp", "-al", str(before), str(after)], check=True)
    (after / "etc" / "a").unlink()
    (after / "etc" / "b").write_bytes(b"b\n")
    from workers.node.image.disk import make_ext4

    parent = tmp_path / "p.ext4"
    make_ext4(before, parent, 256 * MiB)
    out = tmp_path / "c.ext4"
    derive(parent, before, after, out, 256 * MiB)  # e2fsck -fn inside
    got = _describe(_rdump(out, tmp_path / "dump"))
    assert "etc/b" in got and "etc/a" not in got
    assert not any(k.startswith(".aenv") for k in got)
