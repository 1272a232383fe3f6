"""`ImageManifest`: an image as content (images-at-scale §2), among the other manifests."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.diskdigest import chunk_list
from tests.unit.snapshot.test_manifest import manifest as snapshot_manifest
from workers.snapshot import BlobRef, ImageManifest, MemoryRef, VolumeManifest
from workers.snapshot.images import disk_digest
from workers.snapshot.manifest import parse_manifest

A, B, K, N = "a" * 64, "b" * 64, "c" * 64, "d" * 64
DISK = MemoryRef(size=10 << 20, chunk_size=4 << 20, chunks=(A, None, B))


def image(**over: object) -> ImageManifest:
    fields: dict[str, object] = dict(
        digest=disk_digest(DISK),
        role="root",
        recipe="e" * 64,
        label="debian",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        disk=DISK,
        kernel=BlobRef(digest=K, size=7),
        initrd=BlobRef(digest=N, size=3),
    )
    fields.update(over)
    return ImageManifest.model_validate(fields)


def test_parse_tells_the_three_kinds_apart() -> None:
    img = image()
    vol = VolumeManifest(key="vol-x-1", volume_id="x", created_at=img.created_at, image=DISK)
    snap = snapshot_manifest()
    assert parse_manifest(img.to_json()) == img
    assert isinstance(parse_manifest(vol.to_json()), VolumeManifest)
    assert parse_manifest(snap.to_json()) == snap
    assert ImageManifest.from_json(img.to_json()) == img


def test_blob_digests_are_chunks_kernel_and_initrd() -> None:
    assert image().blob_digests() == {A, B, K, N}  # the zero chunk is no blob
    runtime = image(role="runtime", kernel=None, initrd=None)
    assert runtime.blob_digests() == {A, B}
    assert image().stored_bytes == (4 << 20) + (2 << 20) + 7 + 3


def test_its_key_is_its_content_digest() -> None:
    img = image()
    assert img.key == f"image-{img.digest}"


def test_bad_fields_are_refused() -> None:
    doc = image().model_dump(mode="json")
    for bad in ({"digest": "nothex"}, {"role": "other"}, {"surprise": 1}, {"format": 2}):
        with pytest.raises(ValidationError):
            ImageManifest.model_validate({**doc, **bad})


def test_disk_digest_of_a_ref_is_the_files_content_digest(tmp_path: Path) -> None:
    """The digest the repository names an image by is the one a node computes from the
    file (`shared.diskdigest.chunk_list`), for the same chunking."""
    path = tmp_path / "disk"
    with path.open("wb") as f:
        f.truncate(9 << 20)
        f.seek(5 << 20)
        f.write(os.urandom(4096))
    listed = chunk_list(path)
    ref = MemoryRef(size=listed.size, chunk_size=listed.chunk_size, chunks=listed.chunks)
    assert disk_digest(ref) == listed.digest
    assert disk_digest(ref.model_copy(update={"size": ref.size - 1})) != listed.digest
