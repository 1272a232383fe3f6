"""The image cache is keyed by what a disk *is* (issue 40, design S3): a recipe points at
the bytes it built, so two builds that give the same bytes are one entry, and a rebuild that
gives other bytes never replaces the disk under captures already stacked on it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from shared.diskdigest import chunk_list
from workers.node.image import cache
from workers.node.image.build import find_image
from workers.node.image.content import content_of, recipe_of

MIB = 1 << 20


def _build(root: Path, recipe: str, payload: bytes) -> Path:
    """What `_assemble` does around mkfs: stage an entry, hash its disk, publish it."""
    with cache.locked(root, recipe), cache.staging(root, recipe) as tmp:
        disk = tmp / "root.ext4"
        with disk.open("wb") as f:
            f.truncate(16 * MIB)
            f.seek(MIB)
            f.write(payload)
        digest = chunk_list(disk).digest
        for name in ("vmlinux", "initrd.cpio"):
            (tmp / name).write_bytes(b"k")
        manifest = {"digest": recipe, "kernel_cmdline_base": "", "content": {"digest": digest}}
        (tmp / "manifest.json").write_text(json.dumps(manifest))
        return cache.publish_content(root, tmp, recipe, digest)


def _dots(root: Path) -> list[str]:
    return [p.name for p in root.rglob(".tmp-*")]


def test_two_recipes_of_the_same_bytes_are_one_entry(tmp_path: Path) -> None:
    root = cache.cache_root(tmp_path)
    first = _build(root, "a" * 64, b"same bytes")
    second = _build(root, "b" * 64, b"same bytes")
    assert first == second == root / "images" / chunk_list(first / "root.ext4").digest
    assert cache.entry_dir(root, "a" * 64) == cache.entry_dir(root, "b" * 64) == first
    assert len(list((root / "images").iterdir())) == 1
    assert _dots(root) == []  # the second staging dir was dropped, not left behind
    # each recipe still finds it as its own image
    assert find_image("b" * 64, root).digest == "b" * 64
    assert find_image("b" * 64, root).rootfs == first / "root.ext4"


def test_a_rebuild_of_the_same_bytes_keeps_the_disk_captures_are_stacked_on(
    tmp_path: Path,
) -> None:
    root = cache.cache_root(tmp_path)
    first = _build(root, "a" * 64, b"one build")
    stamp = os.stat(first / "root.ext4").st_ino
    again = _build(root, "a" * 64, b"one build")
    assert again == first and os.stat(first / "root.ext4").st_ino == stamp


def test_a_rebuild_of_other_bytes_is_a_new_entry_beside_the_old(tmp_path: Path) -> None:
    """A capture over the old disk stays valid: its backing file is neither replaced nor
    removed; only the recipe moves to the new bytes."""
    root = cache.cache_root(tmp_path)
    old = _build(root, "a" * 64, b"first build")
    before = (old / "root.ext4").read_bytes()
    new = _build(root, "a" * 64, b"other bytes")
    assert new != old and (old / "root.ext4").read_bytes() == before
    assert cache.entry_dir(root, "a" * 64) == new
    assert content_of(old / "root.ext4") == old.name  # still the bytes it is named by


def test_an_entry_built_before_content_keys_is_still_found(tmp_path: Path) -> None:
    root = cache.cache_root(tmp_path)
    legacy = root / ("c" * 64)
    legacy.mkdir()
    (legacy / "manifest.json").write_text(json.dumps({"digest": "c" * 64}))
    assert cache.entry_dir(root, "c" * 64) == legacy
    assert recipe_of(legacy / "root.ext4") == "c" * 64
    assert cache.entry_dir(root, "d" * 64) is None


def test_a_capture_names_the_recipe_of_its_disk(tmp_path: Path) -> None:
    root = cache.cache_root(tmp_path)
    entry = _build(root, "e" * 64, b"bytes")
    assert entry.name != "e" * 64 and recipe_of(entry / "root.ext4") == "e" * 64
    runtime = tmp_path / "elsewhere" / "runtime-f00" / "runtime.ext4"
    assert recipe_of(runtime) == "f00"  # outside the cache: named by its directory


def test_gc_removes_replaced_bytes_and_forgets_their_recipe(tmp_path: Path) -> None:
    root = cache.cache_root(tmp_path)
    old = _build(root, "a" * 64, b"replaced")
    named = _build(root, "b" * 64, b"named")
    cache.link_name(root, "mine", "b" * 64)
    gone = _build(root, "c" * 64, b"unlinked later")
    os.utime(old / "manifest.json", (1, 1))
    os.utime(named / "manifest.json", (2, 2))
    os.utime(gone / "manifest.json", (3, 3))
    new = _build(root, "a" * 64, b"rebuilt")
    assert cache.collect_garbage(root, keep=1) == [gone, old]
    assert cache.entry_dir(root, "a" * 64) == new and named.is_dir()
    assert find_image("mine", root).rootfs == named / "root.ext4"
    assert not (root / "recipes" / ("c" * 64)).is_symlink()  # dangling: dropped
