"""`SnapshotRepository` over every store: round trip, dedup, resume, cache, GC."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.metrics import Scrape
from tests.contract.snapshot.builders import (
    MACHINE,
    MEM_SIZE,
    allocated,
    build_snapshot,
    derive_snapshot,
    run,
    same_content,
    sha256,
)
from tests.series import SNAPSHOT, samples
from workers.node.runtime.snapshot import Snapshot
from workers.snapshot import (
    BlobCache,
    BlobSource,
    LayoutError,
    ManifestNotFound,
    RetryableStoreError,
    RetryPolicy,
    SnapshotRepository,
    SnapshotStore,
    StoreError,
)
from workers.snapshot.metrics import TransferMetrics

BASE_DIGEST = "b" * 64
MIB = 1 << 20


class CountingStore:
    """The real store, with its blob PUTs counted (and optionally cut off, like a crash)."""

    def __init__(self, inner: SnapshotStore, crash_after: int | None = None):
        self.inner = inner
        self.puts: list[str] = []
        self.crash_after = crash_after

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def put_blob(self, digest: str, source: BlobSource) -> None:
        if self.crash_after is not None and len(self.puts) >= self.crash_after:
            raise StoreError("simulated node crash")
        await self.inner.put_blob(digest, source)
        self.puts.append(digest)


class FlakyStore(CountingStore):
    """Every first attempt at a blob operation fails the way a struggling S3 does."""

    def __init__(self, inner: SnapshotStore):
        super().__init__(inner)
        self.failed: set[tuple[str, str]] = set()

    def _flake(self, op: str, digest: str) -> None:
        if (op, digest) not in self.failed:
            self.failed.add((op, digest))
            raise RetryableStoreError(f"503 on {op}")

    async def has_blob(self, digest: str) -> bool:
        self._flake("has", digest)
        return await self.inner.has_blob(digest)

    async def put_blob(self, digest: str, source: BlobSource) -> None:
        self._flake("put", digest)
        await super().put_blob(digest, source)

    async def get_blob_to(self, digest: str, dest: Path) -> int:
        self._flake("get", digest)
        return await self.inner.get_blob_to(digest, dest)


def repo_for(store: Any, tmp_path: Path, budget: int = 1 << 40) -> SnapshotRepository:
    return SnapshotRepository(store, BlobCache(tmp_path / "cache", budget))


async def test_round_trip_rebuilds_an_identical_restorable_snapshot(
    store: SnapshotStore, tmp_path: Path
) -> None:
    snap = build_snapshot(tmp_path / "node-a")
    repo = repo_for(store, tmp_path)
    up = await repo.upload(snap.dir, base_image_digest=BASE_DIGEST)  # chain from manifest
    m = up.manifest
    assert m.snapshot_id == "snap-1" and m.fingerprint == MACHINE.fingerprint()
    assert len(m.layers) == 3 and m.layers[0].backing_digest is None
    assert m.memory.size == MEM_SIZE
    # 26 MiB of data touches 11 of 128 chunks; holes and the allocated-but-zero chunk at
    # 200 MiB are not stored
    assert sum(c is not None for c in m.memory.chunks) == 11
    assert m.memory.chunks[200 * MIB // m.memory.chunk_size] is None
    assert await repo.list() == ["snap-1"]

    # "Another node": its own copy of the template base, at a different path.
    node_b = tmp_path / "node-b"
    node_b.mkdir()
    base_b = node_b / "base.raw"
    shutil.copyfile(snap.base, base_b)
    local = await repo.download("snap-1", node_b / "snap-1", base_b)

    assert sha256(local.mem) == sha256(snap.mem)
    assert allocated(local.mem) < MEM_SIZE // 8, "rebuilt RAM file lost its holes"
    assert local.state.read_bytes() == (snap.dir / "state").read_bytes()
    run("qemu-img", "check", "-q", str(local.disk_top))
    chain = run("qemu-img", "info", "--backing-chain", "-U", str(local.disk_top))
    assert str(base_b) in chain and str(snap.base) not in chain
    run("qemu-img", "compare", "-q", str(snap.layers[-1]), str(local.disk_top))
    # The node reads the directory as one of its own snapshots.
    node_view = Snapshot.read(local.dir)
    assert node_view.machine == MACHINE
    assert node_view.disk_top == local.disk_top and node_view.base_image == base_b


async def test_layers_into_a_shared_store_outlive_the_snapshot_and_are_reused(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """A node downloads layers into its layer store: the snapshot directory is deleted after
    the resume, and the VM's chain (paused again later) must still be whole; a second
    download of a snapshot sharing those layers reuses them instead of rewriting files that
    may be under a running VM."""
    snap = build_snapshot(tmp_path / "node-a")
    repo = repo_for(store, tmp_path)
    await repo.upload(snap.dir, base_image_digest=BASE_DIGEST)
    node_b = tmp_path / "node-b"
    layers = node_b / "layers"
    node_b.mkdir()
    base_b = node_b / "base.raw"
    shutil.copyfile(snap.base, base_b)
    local = await repo.download("snap-1", node_b / "snap-1", base_b, layers_dir=layers)
    assert all(p.parent == layers for p in local.layers)
    assert not list(layers.glob("*.part"))
    shutil.rmtree(local.dir)  # the resume deleted the snapshot's own files
    run("qemu-img", "check", "-q", str(local.disk_top))
    chain = run("qemu-img", "info", "--backing-chain", "-U", str(local.disk_top))
    assert str(base_b) in chain and str(node_b / "snap-1") not in chain
    run("qemu-img", "compare", "-q", str(snap.layers[-1]), str(local.disk_top))
    inodes = {p.name: p.stat().st_ino for p in layers.glob("*.qcow2")}
    again = await repo.download("snap-1", node_b / "again", base_b, layers_dir=layers)
    assert again.layers == local.layers
    assert {p.name: p.stat().st_ino for p in layers.glob("*.qcow2")} == inodes  # not rewritten
    run("qemu-img", "compare", "-q", str(snap.layers[-1]), str(again.disk_top))


async def test_layers_can_be_passed_explicitly_and_are_checked(
    store: SnapshotStore, tmp_path: Path
) -> None:
    snap = build_snapshot(tmp_path / "node")
    repo = repo_for(store, tmp_path)
    up = await repo.upload(snap.dir, snap.layers, base_image_digest=BASE_DIGEST)
    assert len(up.manifest.layers) == 3
    with pytest.raises(LayoutError, match="backed by"):
        await repo.upload(snap.dir, [snap.layers[0], snap.layers[2]], base_image_digest=BASE_DIGEST)
    (snap.dir / "mem").unlink()
    with pytest.raises(LayoutError, match="no mem file"):
        await repo.upload(snap.dir, base_image_digest=BASE_DIGEST)


async def test_second_snapshot_uploads_only_what_changed(
    store: SnapshotStore, tmp_path: Path
) -> None:
    first = build_snapshot(tmp_path / "node")
    counting = CountingStore(store)
    repo = repo_for(counting, tmp_path)
    up1 = await repo.upload(first.dir, base_image_digest=BASE_DIGEST)
    assert len(counting.puts) == up1.blobs_uploaded == len(up1.manifest.blob_digests())

    counting.puts.clear()
    second = derive_snapshot(first, "snap-2")
    assert not same_content(first.mem, second.mem)  # (the comparison sees one page)
    up2 = await repo.upload(second.dir, base_image_digest=BASE_DIGEST, parent_id="snap-1")
    changed = set(up2.manifest.memory.chunks) - set(up1.manifest.memory.chunks)
    assert len(changed) == 1  # one page changed -> one 4 MiB chunk
    # the changed chunk and the new device state; layers and every other chunk are reused
    assert sorted(counting.puts) == sorted([*changed, up2.manifest.state.digest])
    assert up2.bytes_uploaded <= 4 * MIB + 64 * 1024
    assert up2.manifest.parent_id == "snap-1"


async def test_upload_interrupted_midway_resumes(store: SnapshotStore, tmp_path: Path) -> None:
    snap = build_snapshot(tmp_path / "node")
    crashing = CountingStore(store, crash_after=4)
    with pytest.raises(StoreError, match="simulated node crash"):
        await repo_for(crashing, tmp_path).upload(snap.dir, base_image_digest=BASE_DIGEST)
    assert await store.list_manifests() == []  # no manifest: the snapshot is not there yet

    resumed = CountingStore(store)
    repo = repo_for(resumed, tmp_path)
    up = await repo.upload(snap.dir, base_image_digest=BASE_DIGEST)
    total = len(up.manifest.blob_digests())
    assert up.blobs_reused == 4 and len(resumed.puts) == total - 4
    assert not set(resumed.puts) & set(crashing.puts)
    local = await repo.download("snap-1", tmp_path / "restored", snap.base)
    assert same_content(local.mem, snap.mem)


async def test_download_uses_the_cache_and_respects_its_budget(
    store: SnapshotStore, tmp_path: Path
) -> None:
    snap = build_snapshot(tmp_path / "node")
    await repo_for(store, tmp_path / "uploader").upload(snap.dir, base_image_digest=BASE_DIGEST)

    big = repo_for(store, tmp_path / "big")
    first = await big.download("snap-1", tmp_path / "d1", snap.base)
    assert first.blobs_fetched == len(first.manifest.blob_digests())
    again = await big.download("snap-1", tmp_path / "d2", snap.base)
    assert again.blobs_fetched == 0  # every blob came from the node cache
    assert same_content(again.mem, snap.mem)

    budget = 8 * MIB
    small = repo_for(store, tmp_path / "small", budget=budget)
    got = await small.download("snap-1", tmp_path / "d3", snap.base)
    assert same_content(got.mem, snap.mem)
    assert small.cache.used_bytes <= budget
    assert small.cache.used_bytes > 0  # the most recently used blobs stayed


async def test_gc_removes_only_unreferenced_blobs(store: SnapshotStore, tmp_path: Path) -> None:
    first = build_snapshot(tmp_path / "node")
    repo = repo_for(store, tmp_path)
    m1 = (await repo.upload(first.dir, base_image_digest=BASE_DIGEST)).manifest
    m2 = (
        await repo.upload(derive_snapshot(first, "snap-2").dir, base_image_digest=BASE_DIGEST)
    ).manifest
    await repo.delete("snap-1")
    with pytest.raises(ManifestNotFound):
        await repo.get_manifest("snap-1")

    young = await repo.collect_garbage()  # default grace: everything is too young to go
    assert young.deleted == () and young.spared_young == len(m1.blob_digests() - m2.blob_digests())

    report = await repo.collect_garbage(min_age=timedelta(0))
    assert set(report.deleted) == m1.blob_digests() - m2.blob_digests()
    stored = {b.digest async for b in store.iter_blobs()}
    assert stored == m2.blob_digests()
    local = await repo_for(store, tmp_path / "fresh").download(
        "snap-2", tmp_path / "restored", first.base
    )
    assert local.manifest.snapshot_id == "snap-2"


async def test_download_refuses_a_different_base(store: SnapshotStore, tmp_path: Path) -> None:
    snap = build_snapshot(tmp_path / "node")
    repo = repo_for(store, tmp_path)
    await repo.upload(snap.dir, base_image_digest=BASE_DIGEST)
    other = tmp_path / "other.raw"
    other.write_bytes(b"\0" * 4096)
    with pytest.raises(LayoutError, match="base image"):
        await repo.download("snap-1", tmp_path / "x", other)


async def test_transient_store_errors_are_retried(store: SnapshotStore, tmp_path: Path) -> None:
    snap = build_snapshot(tmp_path / "node")
    flaky = FlakyStore(store)
    fast = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.01)
    repo = SnapshotRepository(flaky, BlobCache(tmp_path / "cache", 1 << 40), retry=fast)
    up = await repo.upload(snap.dir, base_image_digest=BASE_DIGEST)
    local = await repo.download("snap-1", tmp_path / "restored", snap.base)
    assert same_content(local.mem, snap.mem)
    n = len(up.manifest.blob_digests())
    assert len(flaky.failed) == 3 * n  # every has, put and get failed once and was retried


async def test_transfers_are_measured_by_direction(store: SnapshotStore, tmp_path: Path) -> None:
    """The node's `aenv_snapshot_transfer_*` series (issue 20): what each upload and
    download moved, how long it took, which failed."""
    scrape = Scrape()
    repo = SnapshotRepository(
        store, BlobCache(tmp_path / "cache", 1 << 40), metrics=TransferMetrics(scrape)
    )

    async def scraped() -> dict[tuple[str, str], float]:
        text = (await scrape.render()).decode()
        return {
            (s.name, s.labels.get("direction", "")): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if not s.name.endswith("_bucket")
        }

    snap = build_snapshot(tmp_path / "node-a")
    up = await repo.upload(snap.dir, base_image_digest=BASE_DIGEST)
    again = await repo.upload(snap.dir, base_image_digest=BASE_DIGEST)  # all stored already
    assert up.bytes_uploaded > 0 and again.bytes_uploaded == 0
    node_b = tmp_path / "node-b"
    node_b.mkdir()
    shutil.copyfile(snap.base, node_b / "base.raw")
    local = await repo.download("snap-1", node_b / "snap-1", node_b / "base.raw")
    with pytest.raises(ManifestNotFound):
        await repo.download("no-such-snap", node_b / "x", node_b / "base.raw")
    s = await scraped()
    assert s[("aenv_snapshot_transfer_bytes_total", "upload")] == up.bytes_uploaded
    assert s[("aenv_snapshot_transfer_bytes_total", "download")] == local.bytes_fetched > 0
    assert s[("aenv_snapshot_transfer_seconds_count", "upload")] == 2
    assert s[("aenv_snapshot_transfer_seconds_count", "download")] == 1
    assert s[("aenv_snapshot_transfer_seconds_sum", "upload")] > 0
    assert s[("aenv_snapshot_transfer_failures_total", "download")] == 1
    assert s[("aenv_snapshot_transfer_failures_total", "upload")] == 0
    text = (await scrape.render()).decode()
    names = {x.name for f in text_string_to_metric_families(text) for x in f.samples}
    assert samples(SNAPSHOT) <= names, samples(SNAPSHOT) - names


def _volume_image(path: Path, size: int, writes: dict[int, bytes]) -> Path:
    """A sparse volume image of `size` bytes with data only at the given offsets."""
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, data in writes.items():
            f.seek(offset)
            f.write(data)
    return path


async def test_a_volume_image_round_trips_sparse_and_its_next_version_sends_what_changed(
    store: SnapshotStore, tmp_path: Path
) -> None:
    size = 1 << 34  # 16 GiB, nearly all holes: only the written chunks are read and stored
    image = _volume_image(
        tmp_path / "img", size, {0: b"superblock" * 100, 5 << 30: b"x" * (3 * MIB)}
    )
    counting = CountingStore(store)
    repo = repo_for(counting, tmp_path)
    up = await repo.upload_volume(image, key="vol-abc-1", volume_id="abc")
    assert up.blobs_uploaded == len(counting.puts) == 2 and up.bytes_uploaded <= 8 * MIB
    got = await repo_for(store, tmp_path / "other").download_volume("vol-abc-1", tmp_path / "got")
    assert got.volume_id == "abc" and same_content(tmp_path / "got", image)
    assert os_size(tmp_path / "got") == size and allocated(tmp_path / "got") < 16 * MIB

    counting.puts.clear()
    with open(image, "r+b") as f:  # one more chunk written: only it is sent
        f.seek(9 << 30)
        f.write(b"y" * 4096)
    up2 = await repo.upload_volume(image, key="vol-abc-2", volume_id="abc")
    assert len(counting.puts) == 1 and up2.blobs_reused == 2


async def test_gc_keeps_what_volume_images_name(store: SnapshotStore, tmp_path: Path) -> None:
    image = _volume_image(tmp_path / "img", 64 * MIB, {MIB: b"data" * 1000})
    repo = repo_for(store, tmp_path)
    up = await repo.upload_volume(image, key="vol-abc-1", volume_id="abc")
    report = await repo.collect_garbage(min_age=timedelta(0))
    assert report.deleted == () and up.manifest.blob_digests() <= {
        b.digest async for b in store.iter_blobs()
    }
    with pytest.raises(LayoutError):  # a volume's manifest is not a snapshot's
        await repo.get_manifest("vol-abc-1")


def os_size(path: Path) -> int:
    return path.stat().st_size


async def test_a_capture_is_rebuilt_on_the_same_bytes_only(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """The manifest carries the content digest the capture recorded of its base image
    (`base_content` in its node manifest): another node's copy of the same bytes takes it,
    a copy with one byte changed is refused before anything is fetched, both digests
    named (issue 40)."""
    import json

    from shared.diskdigest import chunk_list

    snap = build_snapshot(tmp_path / "node-a")
    theirs = chunk_list(snap.base).digest
    doc = json.loads((snap.dir / "manifest.json").read_text())
    (snap.dir / "manifest.json").write_text(json.dumps({**doc, "base_content": theirs}))
    repo = repo_for(store, tmp_path)
    up = await repo.upload(snap.dir, base_image_digest=BASE_DIGEST)
    assert up.manifest.base_image.content == theirs

    same = tmp_path / "same.raw"
    shutil.copyfile(snap.base, same)
    local = await repo.download(
        "snap-1", tmp_path / "b", same, base_content=chunk_list(same).digest, foreign=True
    )
    run("qemu-img", "compare", "-q", str(snap.layers[-1]), str(local.disk_top))

    other = tmp_path / "other.raw"
    shutil.copyfile(snap.base, other)
    with open(other, "r+b") as f:
        f.seek(30 * MIB)  # in a hole: a byte no layer covers
        f.write(b"\1")
    ours = chunk_list(other).digest
    with pytest.raises(LayoutError) as refused:
        await repo.download("snap-1", tmp_path / "c", other, base_content=ours, foreign=True)
    assert theirs in str(refused.value) and ours in str(refused.value)
    assert not (tmp_path / "c").exists()
