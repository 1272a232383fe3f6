"""A disk in the image cache always has a content digest a capture can record: the one its
build recorded, or (a disk built before digests were recorded, or changed since it was
hashed) the one hashed now and recorded in its manifest."""

from __future__ import annotations

import json
import os
from pathlib import Path

from shared.diskdigest import chunk_list
from workers.node.image.content import content_of, recorded_content

MIB = 1 << 20


def disk_in_cache(tmp_path: Path, manifest: dict[str, object]) -> Path:
    entry = tmp_path / "cache" / ("9" * 64)
    entry.mkdir(parents=True)
    disk = entry / "root.ext4"
    with open(disk, "wb") as f:
        f.truncate(64 * MIB)
        f.seek(5 * MIB)
        f.write(os.urandom(MIB))
    (entry / "manifest.json").write_text(json.dumps(manifest))
    return disk


def test_a_disk_built_before_digests_is_hashed_once_and_recorded(tmp_path: Path) -> None:
    disk = disk_in_cache(tmp_path, {"digest": "9" * 64, "rootfs": {"size": 64 * MIB}})
    assert recorded_content(disk) is None
    digest = content_of(disk)
    assert digest == chunk_list(disk).digest
    doc = json.loads((disk.parent / "manifest.json").read_text())
    assert doc["content"]["digest"] == digest and doc["rootfs"] == {"size": 64 * MIB}
    assert recorded_content(disk) == digest


def test_the_recorded_digest_is_taken_as_it_is(tmp_path: Path) -> None:
    disk = disk_in_cache(tmp_path, {"content": {"digest": "f" * 64}})
    assert content_of(disk) == "f" * 64  # no read of the disk: the build recorded it


def test_a_disk_changed_since_it_was_hashed_is_hashed_again(tmp_path: Path) -> None:
    disk = disk_in_cache(tmp_path, {})
    first = content_of(disk)
    with open(disk, "r+b") as f:
        f.seek(40 * MIB)
        f.write(b"other bytes")
    assert recorded_content(disk) is None  # its stamp no longer matches
    again = content_of(disk)
    assert again != first and again == chunk_list(disk).digest


def test_a_disk_outside_the_cache_is_hashed_and_nothing_written(tmp_path: Path) -> None:
    disk = tmp_path / "base.raw"
    disk.write_bytes(os.urandom(4096))
    assert content_of(disk) == chunk_list(disk).digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.raw"]


def test_a_rewritten_manifest_is_read_again(tmp_path: Path) -> None:
    """The process remembers a digest only while the disk and its manifest are unchanged."""
    disk = disk_in_cache(tmp_path, {"content": {"digest": "f" * 64}})
    assert content_of(disk) == "f" * 64
    new = disk.parent / "manifest.new"
    new.write_text(json.dumps({"content": {"digest": "e" * 64}}))
    os.replace(new, disk.parent / "manifest.json")  # a new inode, as every writer does
    assert content_of(disk) == "e" * 64
