"""Repository GC runs (images-at-scale S11), over real NATS and SeaweedFS.

A repository with real captures (uploaded by `SnapshotRepository` from snapshot
directories the real tools made), a volume image and two images (one every capture was
taken over, one nobody names); a killed sandbox, a paused one, a deleted template and a
kept one in the log. The janitor (the shared durable consumer the nodes run) deletes the
manifests of what is gone; then two GC runners race for the lease, one runs with
`min_age=0`: the blobs left in S3 are exactly those the remaining manifests name, and the
capture and the image that remain still download bit-for-bit.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import uuid4

import pytest
from prometheus_client.parser import text_string_to_metric_families

from aenv.stack import S3Endpoint
from bus import Bus, MessageContext
from bus.decisions import execute
from bus.envelope import encode_event
from domain import image as im
from domain import sandbox as sb
from domain import template as tp
from domain.messages import Event
from shared.diskdigest import chunk_list
from shared.metrics import Scrape
from tests.contract.snapshot.builders import build_snapshot, same_content, sha256
from tests.contract.snapshot.conftest import s3_config, s3_endpoint
from tests.contract.snapshot.test_image_contract import make_image
from tests.series import REPOSITORY_GC, samples
from tests.support import eventually
from workers.snapshot import (
    BlobCache,
    GcReport,
    ImageRepository,
    S3Store,
    SnapshotRepository,
)
from workers.snapshot.gcmetrics import MANIFEST_KINDS as KINDS
from workers.snapshot.gcmetrics import GcMetrics
from workers.snapshot.gcrun import RepositoryGc
from workers.snapshot.janitor import RepositoryJanitor
from workers.snapshot.manifest import TraceManifest, parse_manifest
from workers.snapshot.paths import image_key, trace_key

__all__ = ["s3_endpoint"]

MIB = 1 << 20


@pytest.fixture
async def repo(s3_endpoint: S3Endpoint, tmp_path: Path) -> AsyncIterator[SnapshotRepository]:
    store = await S3Store.open(s3_config(s3_endpoint))
    try:
        yield SnapshotRepository(store, BlobCache(tmp_path / "cache", 1 << 30))
    finally:
        await store.close()


async def record(bus: Bus, aggregate_id: str, event: Event) -> None:
    """Append a sandbox's fact without the commands that led to it (the janitor reads a
    sandbox's history; it never folds it)."""
    version = await bus.sandboxes.version(aggregate_id)
    _, data = encode_event(
        event,
        event_id=sb.derived_command_id(aggregate_id, str(version.revision)),
        aggregate_id=aggregate_id,
        aggregate_version=version.revision + 1,
        context=MessageContext(),
    )
    await bus.js.publish(bus.names.sandbox_events(aggregate_id), data)


def now() -> datetime:
    return datetime.now(UTC)


async def stored_blobs(repo: SnapshotRepository) -> set[str]:
    return {b.digest async for b in repo.store.iter_blobs()}


async def named_blobs(repo: SnapshotRepository) -> set[str]:
    out: set[str] = set()
    for mid in await repo.list():
        out |= parse_manifest(await repo.store.get_manifest(mid)).blob_digests()
    return out


async def test_gc_leaves_exactly_what_the_remaining_manifests_name(
    bus: Bus, repo: SnapshotRepository, tmp_path: Path
) -> None:
    images = ImageRepository(repo.store)
    run = secrets.token_hex(3)
    base_dir, orphan_dir = tmp_path / "img-base", tmp_path / "img-orphan"
    make_image(base_dir, 64 * MIB, [0, 20 * MIB], zero_at=40 * MIB)
    make_image(orphan_dir, 64 * MIB, [8 * MIB], zero_at=40 * MIB)
    # recipes of this run only: the image aggregates are shared by the session's tests
    base = await images.upload_image(base_dir, recipe=secrets.token_hex(32), role="root")
    orphan = await images.upload_image(orphan_dir, recipe=secrets.token_hex(32), role="root")
    base_disk = base_dir / "root.ext4"
    assert base.manifest.digest == chunk_list(base_disk).digest
    for up in (base, orphan):
        await execute(
            bus.images,
            im.PublishImage(
                image_id=im.image_aggregate_id(up.manifest.recipe),
                digest=up.manifest.digest,
                stored_bytes=up.manifest.stored_bytes,
                size=up.manifest.disk.size,
                role="root",
            ),
        )
    # read traces (the block service's): each image's, and one whose image is gone
    stray = secrets.token_hex(32)
    for digest in (base.manifest.digest, orphan.manifest.digest, stray):
        trace = TraceManifest(digest=digest, created_at=now(), window_s=30, chunks=(3, 0, 1))
        await repo.store.put_manifest(trace.key, trace.to_json())
    # captures over the base image, each with its own RAM and device state; layers shared
    node = tmp_path / "node"
    ids = {
        "killed": [f"p-{run}-a1", f"p-{run}-a2"],
        "paused": [f"p-{run}-b1"],
        "gone-tpl": [f"t-{run}-x"],
        "kept-tpl": [f"t-{run}-y"],
    }
    dirs: dict[str, Path] = {}
    for sid in [s for group in ids.values() for s in group]:
        snap = build_snapshot(node, sid, base=base_disk)
        doc = json.loads((snap.dir / "manifest.json").read_text())
        doc["base_content"] = base.manifest.digest
        (snap.dir / "manifest.json").write_text(json.dumps(doc))
        await repo.upload(snap.dir, base_image_digest="1" * 64, snapshot_id=sid)
        dirs[sid] = snap.dir
    volume = tmp_path / "vol.img"
    with volume.open("wb") as f:
        f.truncate(16 * MIB)
        f.write(secrets.token_bytes(MIB))
    await repo.upload_volume(volume, key=f"p-{run}-a1-v0", volume_id="vol1")

    # the log: sandbox a paused twice and killed, b paused; template x deleted, y kept
    a, b = f"sbx-{run}-a", f"sbx-{run}-b"
    mount = sb.VolumeMount(name="data", path="/data", volume_id="vol1")
    spec = sb.SandboxSpec(template_id="base", volume_mounts=(mount,))  # one slot: -v0
    requested = sb.SandboxRequested(sandbox_id=a, command_id=uuid4(), spec=spec, at=now())
    await record(bus, a, requested)
    for sid in ids["killed"]:
        await record(
            bus, a, sb.SandboxPaused(sandbox_id=a, remaining_s=60, at=now(), snapshot_id=sid)
        )
    await record(
        bus,
        b,
        sb.SandboxPaused(sandbox_id=b, remaining_s=60, at=now(), snapshot_id=ids["paused"][0]),
    )
    for name, key in ((f"x{run}", ids["gone-tpl"][0]), (f"y{run}", ids["kept-tpl"][0])):
        await execute(bus.templates, tp.RegisterTemplate(template_id=name))
        await execute(bus.templates, tp.RecordTemplateUpload(template_id=name, key=key))

    scrape = Scrape()
    metrics = GcMetrics(scrape)
    janitors = [
        RepositoryJanitor(bus, repo.store, metrics=metrics, kill_settle_s=1.0) for _ in range(2)
    ]
    for j in janitors:  # two nodes sharing the durable consumer
        await j.start()
    try:
        await record(bus, a, sb.SandboxKilled(sandbox_id=a, at=now()))
        # x is registered again (its state forgets capture_key; the store does not), then
        # deleted before a new upload: its last uploaded capture goes
        await execute(bus.templates, tp.RegisterTemplate(template_id=f"x{run}", cpu_count=1))
        await execute(bus.templates, tp.DeleteTemplate(template_id=f"x{run}"))
        expected = {
            ids["paused"][0],
            ids["kept-tpl"][0],
            image_key(base.manifest.digest),
            image_key(orphan.manifest.digest),
            trace_key(base.manifest.digest),
            trace_key(orphan.manifest.digest),
            trace_key(stray),
        }

        async def tidied() -> bool:
            return set(await repo.list()) == expected

        await eventually(tidied, timeout=30)
        deleted = scrape.registry.get_sample_value

        def kinds() -> dict[str, float | None]:
            return {
                k: deleted("aenv_repository_manifests_deleted_total", {"kind": k}) for k in KINDS
            }

        # a1, a2 and their volumes' keys (a2-v0 was never stored: deleting it is a no-op, counted
        # just after the listing already matched, so the count is awaited, not read once)
        want = {"pause": 4, "template": 1, "image": 0, "trace": 0}

        async def counted() -> bool:
            return kinds() == want

        await eventually(counted, timeout=10)
        assert kinds() == want

        # two nodes' GC runners at once: one takes the lease and runs
        runners = [
            RepositoryGc(
                bus,
                j,
                f"node-{i}",
                every_s=2,
                min_age=timedelta(0),
                image_grace=timedelta(0),
            )
            for i, j in enumerate(janitors)
        ]
        reports = await asyncio.gather(*(r.run_once() for r in runners))
        ran = [r for r in reports if r is not None]
        assert len(ran) == 1 and ran[0].deleted
        assert await runners[0].run_once() is None  # the lease holds for its period
        assert await (await runners[0].lease()).holder() in {"node-0", "node-1"}

        # the forgotten image's chunks go a period later: the next round, whoever runs it
        async def next_round() -> GcReport | None:
            return await runners[1].run_once()

        later = await eventually(next_round, timeout=15, interval=0.5)
        assert orphan.manifest.blob_digests() - base.manifest.blob_digests() <= set(later.deleted)

        # the image no capture names is forgotten, in the log and the store, its trace with
        # it; the trace whose image was never there goes too; the base's trace stays
        expected -= {
            image_key(orphan.manifest.digest),
            trace_key(orphan.manifest.digest),
            trace_key(stray),
        }
        assert set(await repo.list()) == expected
        forgotten, _ = await bus.images.load(im.image_aggregate_id(orphan.manifest.recipe))
        assert forgotten is not None and forgotten.published is None
        kept, _ = await bus.images.load(im.image_aggregate_id(base.manifest.recipe))
        assert kept is not None and kept.published is not None

        # exactly the blobs the remaining manifests name
        assert await stored_blobs(repo) == await named_blobs(repo)
        exposed = {
            s.name
            for f in text_string_to_metric_families((await scrape.render()).decode())
            for s in f.samples
            if s.name.startswith("aenv_repository_")
        }
        assert exposed == samples(REPOSITORY_GC)
        gc_bytes = scrape.registry.get_sample_value("aenv_repository_gc_deleted_bytes_total")
        assert gc_bytes == ran[0].bytes_freed + later.bytes_freed
    finally:
        for j in janitors:
            await j.stop()

    # what remains restores bit-for-bit, from the store alone (an empty cache)
    fresh = SnapshotRepository(repo.store, BlobCache(tmp_path / "cache-2", 1 << 30))
    got = await fresh.download(ids["paused"][0], tmp_path / "restored", base_disk)
    src = dirs[ids["paused"][0]]
    assert same_content(got.mem, src / "mem")
    assert sha256(got.state) == sha256(src / "state")
    image = await ImageRepository(repo.store).download_image(
        base.manifest.digest, tmp_path / "img-restored"
    )
    assert sha256(image.disk) == sha256(base_disk)


async def test_a_forgotten_image_goes_unless_published_again(
    bus: Bus, repo: SnapshotRepository, tmp_path: Path
) -> None:
    """`ImageForgotten` (an operator's, or the GC's own, delivered again) deletes
    `image-<digest>`; once the recipe is published again with the same bytes, an old
    forget is stale, and while a capture names the bytes, they stay too."""
    images = ImageRepository(repo.store)
    make_image(tmp_path / "img", 16 * MIB, [0], zero_at=8 * MIB)
    up = await images.upload_image(tmp_path / "img", recipe=secrets.token_hex(32), role="root")
    iid = im.image_aggregate_id(up.manifest.recipe)
    publish = im.PublishImage(
        image_id=iid,
        digest=up.manifest.digest,
        stored_bytes=up.manifest.stored_bytes,
        size=up.manifest.disk.size,
        role="root",
    )
    await execute(bus.images, publish)
    await execute(bus.images, im.ForgetImage(image_id=iid))
    forgotten = [r for r in await bus.images.read(iid) if isinstance(r.event, im.ImageForgotten)]
    assert len(forgotten) == 1
    janitor = RepositoryJanitor(bus, repo.store)

    await execute(bus.images, publish.model_copy(update={"command_id": uuid4()}))
    assert await janitor.tidy(forgotten[0]) == []  # published again: stale
    assert await images.has_image(up.manifest.digest)

    await execute(bus.images, im.ForgetImage(image_id=iid))
    snap = build_snapshot(tmp_path / "node", "p-over", base=tmp_path / "img" / "root.ext4")
    doc = json.loads((snap.dir / "manifest.json").read_text())
    doc["base_content"] = up.manifest.digest
    (snap.dir / "manifest.json").write_text(json.dumps(doc))
    capture = f"p-{secrets.token_hex(3)}"
    await repo.upload(snap.dir, base_image_digest=up.manifest.recipe, snapshot_id=capture)
    assert await janitor.tidy(forgotten[0]) == []  # a capture is taken over these bytes
    assert await images.has_image(up.manifest.digest)

    await repo.delete(capture)
    trace = TraceManifest(digest=up.manifest.digest, created_at=now(), window_s=30, chunks=(0,))
    await repo.store.put_manifest(trace.key, trace.to_json())
    digest = up.manifest.digest
    assert await janitor.tidy(forgotten[0]) == [image_key(digest), trace_key(digest)]
    assert not await images.has_image(digest)
    assert trace.key not in await repo.list()  # its trace went with it
