"""The root disk's size rules and mkfs (issue 40): what a tree needs counts each inode once
and whole blocks; a disk keeps the free space asked for; two runs over one untouched tree
give the same bytes; the sparse file costs the host what the data takes, not its size."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from workers.node.image.disk import (
    INODE_BYTES,
    METADATA_ALLOWANCE,
    census,
    disk_uuid,
    make_ext4,
    need_bytes,
    root_size,
)
from workers.node.image.errors import ImageError

MiB = 1 << 20
GiB = 1 << 30

needs_mkfs = pytest.mark.skipif(
    shutil.which("mkfs.ext4") is None or shutil.which("dumpe2fs") is None,
    reason="e2fsprogs (mkfs.ext4, dumpe2fs, e2fsck) is not installed",
)


def _tree(root: Path) -> Path:
    """7 inodes: the root, a dir, a 1-byte file, a 5000-byte file hard-linked twice, a
    1 GiB sparse file, a short symlink."""
    (root / "d").mkdir(parents=True)
    (root / "d/one").write_bytes(b"x")
    (root / "d/five").write_bytes(os.urandom(5000))
    os.link(root / "d/five", root / "five-again")
    os.link(root / "d/five", root / "d/five-thrice")
    with (root / "sparse").open("wb") as f:
        f.truncate(GiB)
    (root / "link").symlink_to("d/one")
    return root


def _calm(root: Path) -> None:
    """Fixed times, atime after mtime and ctime: mkfs -d copies atime and ctime, and a
    first read under relatime would otherwise move the atime between two runs."""
    for dirpath, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.utime(
                os.path.join(dirpath, name), (2_000_000_000, 1_600_000_000), follow_symlinks=False
            )
    os.utime(root, (2_000_000_000, 1_600_000_000))


def test_need_bytes_counts_inodes_once_in_whole_blocks(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "t")
    # root dir, d: a block each; one: 1 block; five (one inode, three names): 2 blocks;
    # sparse: no data; short symlink: in the inode
    data = 2 * 4096 + 4096 + 8192
    assert need_bytes(tree) == data + 6 * INODE_BYTES + METADATA_ALLOWANCE
    assert census(tree).inodes == 6
    # the apparent size (1 GiB + 15 kB) is no measure of it
    assert need_bytes(tree) < METADATA_ALLOWANCE + MiB


def test_root_size_keeps_the_free_space() -> None:
    for need, free in ((200 * MiB, 8 * GiB), (2300 * MiB, 8 * GiB), (6 * GiB, 0), (1, 1)):
        size = root_size(need, free)
        assert size % (256 * MiB) == 0
        assert size >= need * 1.05 + free + size // 64  # the inode tables come out of it
        assert size <= (need * 1.05 + free) * 1.04 + 256 * MiB
    with pytest.raises(ImageError):
        root_size(-1, 0)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _free_blocks_bytes(image: Path) -> int:
    out = subprocess.run(["dumpe2fs", "-h", str(image)], capture_output=True, text=True).stdout
    m = re.search(r"^Free blocks:\s+(\d+)", out, re.M)
    assert m is not None, out
    return int(m.group(1)) * 4096


def _fsck(image: Path) -> None:
    proc = subprocess.run(["e2fsck", "-fn", str(image)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_mkfs
def test_two_runs_on_one_tree_give_the_same_bytes(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "t")
    _calm(tree)
    fs_uuid = disk_uuid(hashlib.sha256(b"recipe").hexdigest())
    size = root_size(need_bytes(tree), 64 * MiB)
    images = [tmp_path / "a.ext4", tmp_path / "b.ext4"]
    for image in images:
        make_ext4(tree, image, size, fs_uuid=fs_uuid, fake_time=1_700_000_000)
    assert _sha256(images[0]) == _sha256(images[1])
    _fsck(images[0])
    # without the fixed uuid the bytes differ (the control: the comparison can fail)
    make_ext4(tree, images[1], size, fake_time=1_700_000_000)
    assert _sha256(images[0]) != _sha256(images[1])


@needs_mkfs
def test_the_disk_costs_its_data_and_keeps_its_free_space(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    (tree / "data").mkdir(parents=True)
    payload = os.urandom(MiB) * 24  # 24 MiB that are no zeros (mkfs skips zero blocks)
    (tree / "data/big").write_bytes(payload)
    os.link(tree / "data/big", tree / "big-again")  # stored once
    counted = census(tree)
    size = root_size(counted.need, 8 * GiB)
    image = tmp_path / "root.ext4"
    make_ext4(tree, image, size, fs_uuid=uuid.uuid4(), counted=counted)
    assert image.stat().st_size == size >= 8 * GiB
    allocated = image.stat().st_blocks * 512
    # the data plus mkfs's own few MiB: no zeroed journal, no inode tables written out
    assert allocated <= len(payload) * 1.05 + 16 * MiB, allocated
    assert _free_blocks_bytes(image) >= 8 * GiB  # what `df /` shows free in the guest
    _fsck(image)


@needs_mkfs
def test_a_tree_of_many_small_files_gets_the_inodes_it_needs(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    for d in range(20):
        (tree / f"d{d}").mkdir(parents=True)
        for i in range(1000):
            (tree / f"d{d}" / str(i)).touch()
    counted = census(tree)
    size = root_size(counted.need, 0)
    assert size // 16384 < counted.inodes  # the default bytes-per-inode would run out
    image = tmp_path / "root.ext4"
    make_ext4(tree, image, size, counted=counted)
    _fsck(image)


def test_a_tree_larger_than_the_disk_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "f").write_bytes(b"y" * 4096)
    with pytest.raises(ImageError, match="too small"):
        make_ext4(tree, tmp_path / "x.ext4", 64 * MiB)
