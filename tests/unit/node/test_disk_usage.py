"""The node's disk walk: allocated bytes, each inode once, symlinks not followed, each
byte in the category its path says (images-at-scale S7)."""

from __future__ import annotations

import os
from pathlib import Path, PurePath

import pytest

from workers.node.disk import CATEGORIES, IMAGES, STATE, DiskUsage, category_of, scan

DIGEST = "ab" * 32


@pytest.mark.parametrize(
    ("kind", "rel", "category"),
    [
        (IMAGES, f"images/{DIGEST}/root.ext4", "image"),
        (IMAGES, f"images/{DIGEST}/vmlinux", "image"),
        (IMAGES, f"images/{DIGEST}/runtime.ext4", "runtime"),
        (IMAGES, f"images/{DIGEST}", "image"),
        (IMAGES, f"runtime-{DIGEST}/runtime.ext4", "runtime"),
        (IMAGES, f"{DIGEST}/root.ext4", "image"),  # built before content keys
        (IMAGES, "kernel-6.1.0-28-amd64-6.1.119/modules/virtio_blk.ko", "kernel"),
        (IMAGES, f"rootfs-{DIGEST}/usr/bin/python3", "rootfs_tree"),
        (IMAGES, "blobs/sha256/" + DIGEST, "oci_blob"),
        (IMAGES, "oci/python-3.12/index.json", "oci_blob"),
        (IMAGES, "layers/sha256-" + DIGEST + "/tree/etc/passwd", "chain"),
        (IMAGES, f".tmp-{DIGEST}-x1y2/root.ext4", "scratch"),
        (IMAGES, ".locks/base.lock", "scratch"),
        (IMAGES, f"recipes/{DIGEST}", "other"),
        (IMAGES, "names/python", "other"),
        (STATE, "vms/sbx-1/mem", "vm"),
        (STATE, "layers/abc.qcow2", "layer"),
        (STATE, "snapshots/tpl-base/mem", "capture"),
        (STATE, "ram-pool/tpl-base/0", "ram_pool"),
        (STATE, "blob-cache/ab/cd", "blob_cache"),
        (STATE, "blocks/chunks/ab/" + DIGEST, "blob_cache"),
        (IMAGES, f"images/{DIGEST}/root.lazy.qcow2", "image"),
        (STATE, "volumes/vol-1/image", "volume"),
        (STATE, "journal", "other"),
        (STATE, "snapshot-templates/t.json", "other"),
        (STATE, "images/x", "other"),  # `images` means something only in the image cache
        (STATE, "", "other"),
    ],
)
def test_a_path_has_the_category_its_place_says(kind, rel, category) -> None:  # type: ignore[no-untyped-def]
    assert category_of(kind, PurePath(rel)) == category
    assert category in CATEGORIES


def _blocks(path: Path) -> int:
    return os.lstat(path).st_blocks * 512


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    state, images = tmp_path / "state", tmp_path / "images"
    (state / "vms" / "sbx").mkdir(parents=True)
    (images / "layers" / "c1" / "tree").mkdir(parents=True)
    (images / "images" / DIGEST).mkdir(parents=True)
    # a sparse RAM file: 64 MiB long, 8 KiB written
    with (state / "vms" / "sbx" / "mem").open("wb") as f:
        f.truncate(64 << 20)
        f.seek(1 << 20)
        f.write(b"x" * 8192)
    # a chain's file and its hard link in an image: one inode, counted once, under the
    # image (the walk goes in name order, and "images" < "layers")
    (images / "layers" / "c1" / "tree" / "bin").write_bytes(os.urandom(100_000))
    os.link(images / "layers" / "c1" / "tree" / "bin", images / "images" / DIGEST / "bin")
    # a symlink to something big outside the roots: the link, not its target
    (tmp_path / "outside").write_bytes(os.urandom(1 << 20))
    os.symlink(tmp_path / "outside", images / "images" / DIGEST / "big")
    return state, images


def test_the_walk_counts_allocated_bytes_each_inode_once(tmp_path: Path) -> None:
    state, images = _tree(tmp_path)
    tally = scan([(STATE, state), (IMAGES, images)])

    mem = state / "vms" / "sbx" / "mem"
    assert 0 < _blocks(mem) < 1 << 20  # sparse: far less than its 64 MiB
    vm = _blocks(state / "vms") + _blocks(state / "vms" / "sbx") + _blocks(mem)
    assert tally.bytes["vm"] == vm
    entry = images / "images" / DIGEST
    image = sum(_blocks(p) for p in (images / "images", entry, entry / "bin", entry / "big"))
    assert tally.bytes["image"] == image
    chain = sum(
        _blocks(p)
        for p in (images / "layers", images / "layers" / "c1", images / "layers" / "c1" / "tree")
    )
    assert tally.bytes["chain"] == chain  # its file is the image's, not counted again
    assert tally.bytes["other"] == _blocks(state) + _blocks(images)
    every = {state, images, *state.rglob("*"), *images.rglob("*")}
    inodes = {(os.lstat(p).st_dev, os.lstat(p).st_ino): p for p in every}
    assert tally.total == sum(_blocks(p) for p in inodes.values())
    assert _blocks(tmp_path / "outside") > 0  # a target it did not follow


def test_a_root_inside_another_is_walked_as_itself(tmp_path: Path) -> None:
    state = tmp_path / "state"
    images = state / "images-cache"
    (images / "blobs" / "sha256").mkdir(parents=True)
    (images / "blobs" / "sha256" / DIGEST).write_bytes(os.urandom(50_000))
    tally = scan([(STATE, state), (IMAGES, images)])
    blob = images / "blobs" / "sha256" / DIGEST
    assert tally.bytes["oci_blob"] == sum(
        _blocks(p) for p in (images / "blobs", images / "blobs" / "sha256", blob)
    )
    assert tally.bytes["other"] == _blocks(state) + _blocks(images)


def test_missing_roots_hold_nothing(tmp_path: Path) -> None:
    tally = scan([(STATE, tmp_path / "none"), (IMAGES, tmp_path / "neither")])
    assert tally.total == 0
    assert set(tally.bytes) == set(CATEGORIES)


async def test_disk_usage_reports_nothing_before_its_first_walk(tmp_path: Path) -> None:
    state, images = _tree(tmp_path)
    usage = DiskUsage(state, images)
    assert usage.used() is None
    tally = await usage.refresh()
    assert usage.used() == tally.total == scan(usage.roots).total > 0
