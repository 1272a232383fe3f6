from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from workers.snapshot import BaseImageRef, BlobRef, LayerRef, MemoryRef, SnapshotManifest

A, B, C, S = "a" * 64, "b" * 64, "c" * 64, "d" * 64


def manifest(**over: object) -> SnapshotManifest:
    fields: dict[str, object] = dict(
        snapshot_id="snap-1",
        parent_id=None,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        fingerprint="f00d",
        machine={"vcpus": 1},
        base_image=BaseImageRef(digest=B, size=1 << 30),
        layers=(
            LayerRef(digest=A, size=10, backing_digest=None, backing_format="raw"),
            LayerRef(digest=C, size=20, backing_digest=A, backing_format="qcow2"),
        ),
        memory=MemoryRef(size=10 << 20, chunk_size=4 << 20, chunks=(A, None, C)),
        state=BlobRef(digest=S, size=5),
        node_manifest={"format": 1, "snapshot_id": "snap-1"},
    )
    fields.update(over)
    return SnapshotManifest.model_validate(fields)


def test_round_trips_through_json() -> None:
    m = manifest()
    assert SnapshotManifest.from_json(m.to_json()) == m


def test_blob_digests_are_what_gc_must_keep() -> None:
    # the base image is not stored, zero chunks are not blobs
    assert manifest().blob_digests() == {A, C, S}


def test_memory_accounting() -> None:
    mem = manifest().memory
    assert mem.chunk_len(2) == 2 << 20  # the short last chunk
    assert mem.stored_bytes == (4 << 20) + (2 << 20)


def test_chunk_count_must_cover_the_size() -> None:
    with pytest.raises(ValidationError, match="cannot cover"):
        MemoryRef(size=10 << 20, chunk_size=4 << 20, chunks=(A, None))


def test_layers_must_form_one_chain_on_the_base() -> None:
    broken = (
        LayerRef(digest=A, size=1, backing_digest=None, backing_format="raw"),
        LayerRef(digest=C, size=1, backing_digest=B, backing_format="qcow2"),
    )
    with pytest.raises(ValidationError, match="not stacked"):
        manifest(layers=broken)
    wrong_fmt = (LayerRef(digest=A, size=1, backing_digest=None, backing_format="qcow2"),)
    with pytest.raises(ValidationError, match="backing format"):
        manifest(layers=wrong_fmt)
    with pytest.raises(ValidationError, match="at least one"):
        manifest(layers=())


def test_unknown_fields_and_formats_are_refused() -> None:
    doc = manifest().model_dump(mode="json")
    with pytest.raises(ValidationError):
        SnapshotManifest.model_validate({**doc, "surprise": 1})
    with pytest.raises(ValidationError):
        SnapshotManifest.model_validate({**doc, "format": 2})
