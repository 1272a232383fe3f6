"""A capture is stacked only on the bytes it was taken over (issue 40): a restoring node
whose base image or runtime disk has another content digest is refused before anything is
fetched, with both digests named; a capture that recorded no digest stays on its node."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from workers.snapshot import (
    BaseImageRef,
    BlobCache,
    BlobRef,
    LayerRef,
    LayoutError,
    MemoryRef,
    SnapshotManifest,
    SnapshotRepository,
)
from workers.snapshot.samebytes import check_disks

A, C, S = "a" * 64, "c" * 64, "d" * 64
#: the content digests of the capturing node's disks, and of another build of them
THEIRS, OURS = "1" * 64, "2" * 64
RUNTIME_THEIRS, RUNTIME_OURS = "3" * 64, "4" * 64
RECIPE = "e" * 64


def manifest(
    content: str | None = THEIRS, runtime: str | None = RUNTIME_THEIRS
) -> SnapshotManifest:
    node: dict[str, object] = {"format": 2, "snapshot_id": "sbx-p1", "runtime_digest": "r" * 64}
    if content is not None:
        node["base_content"] = content
    if runtime is not None:
        node["runtime_content"] = runtime
    return SnapshotManifest(
        snapshot_id="sbx-p1",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        fingerprint="f00d",
        machine={},
        base_image=BaseImageRef(digest=RECIPE, size=4096, content=content),
        layers=(LayerRef(digest=A, size=10, backing_digest=None, backing_format="raw"),),
        memory=MemoryRef(size=4 << 20, chunk_size=4 << 20, chunks=(C,)),
        state=BlobRef(digest=S, size=5),
        node_manifest=node,
    )


class ManifestOnlyStore:
    """A store holding one manifest: a download that reads any blob (or writes anything)
    fails the test, so a refusal is seen to come before the fetch."""

    def __init__(self, m: SnapshotManifest) -> None:
        self.data = m.to_json()
        self.blob_calls: list[str] = []

    async def get_manifest(self, snapshot_id: str) -> bytes:
        return self.data

    def __getattr__(self, name: str) -> object:
        async def refused(*args: object, **kw: object) -> object:
            self.blob_calls.append(name)
            raise AssertionError(f"the store was asked to {name} after all")

        return refused


async def download(tmp_path: Path, m: SnapshotManifest, **check: object) -> ManifestOnlyStore:
    store = ManifestOnlyStore(m)
    base = tmp_path / "root.ext4"
    base.write_bytes(bytes(4096))
    repo = SnapshotRepository(store, BlobCache(tmp_path / "cache", 1 << 30))  # type: ignore[arg-type]
    try:
        await repo.download("sbx-p1", tmp_path / "dest", base, **check)  # type: ignore[arg-type]
    finally:
        assert store.blob_calls == [] and not (tmp_path / "dest").exists()
    return store


async def test_a_base_image_of_other_bytes_is_refused_before_anything_is_fetched(
    tmp_path: Path,
) -> None:
    with pytest.raises(LayoutError) as refused:
        await download(tmp_path, manifest(), base_content=OURS, foreign=True)
    message = str(refused.value)
    assert THEIRS in message and OURS in message and "base image" in message


async def test_a_runtime_disk_of_other_bytes_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LayoutError) as refused:
        await download(
            tmp_path, manifest(), base_content=THEIRS, runtime_content=RUNTIME_OURS, foreign=True
        )
    message = str(refused.value)
    assert RUNTIME_THEIRS in message and RUNTIME_OURS in message and "runtime" in message


async def test_a_capture_that_recorded_no_digest_never_leaves_its_node(tmp_path: Path) -> None:
    with pytest.raises(LayoutError, match="before captures recorded"):
        await download(
            tmp_path, manifest(content=None, runtime=None), base_content=OURS, foreign=True
        )
    # on its own node (pulled back after its disk lost it) it is rebuilt as before
    check_disks(manifest(content=None, runtime=None), base=OURS, runtime=None, foreign=False)


def test_the_same_bytes_pass() -> None:
    check_disks(manifest(), base=THEIRS, runtime=RUNTIME_THEIRS, foreign=True)
    # this node has no runtime of that recipe: restoring fails on that later, not here
    check_disks(manifest(), base=THEIRS, runtime=None, foreign=True)


def test_a_node_own_capture_is_checked_too() -> None:
    """Its own node rebuilt the image meanwhile (cache wiped): other bytes there as well."""
    with pytest.raises(LayoutError, match=OURS):
        check_disks(manifest(), base=OURS, runtime=None, foreign=False)


def test_an_older_manifest_without_content_still_parses() -> None:
    """A capture uploaded before digests were recorded: one that stays on its node."""
    old = manifest().model_dump(mode="json")
    del old["base_image"]["content"]
    assert SnapshotManifest.model_validate(old).base_image.content is None
