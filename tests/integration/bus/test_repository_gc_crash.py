"""A repository GC round killed -9 mid-way (issue 42: nothing lost on a crash), over real
NATS and SeaweedFS, the round run by a process of its own (`gcpass.py`).

The repository: a kept capture over a kept image, orphan images (some published in the
log) whose chunks only they name, and many blobs nobody names. A round deletes the
unnamed blobs, then forgets the images no capture names (log first, then manifest); their
chunks go the round after. The first round is killed while it deletes blobs, the second
(another node, once the lease ran out) while it forgets images. After each kill no
manifest names a missing blob; then a third node's rounds finish the job: the store holds
exactly the blobs the remaining manifests name, and the kept capture and image restore
bit-for-bit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import pytest

from aenv.stack import S3Endpoint
from bus import Bus, BusSettings, delete_all
from bus.decisions import execute
from bus.leases import Lease
from domain import image as im
from tests.contract.snapshot.builders import build_snapshot, same_content, sha256
from tests.contract.snapshot.conftest import s3_config, s3_endpoint
from tests.contract.snapshot.test_image_contract import make_image
from tests.integration.bus.fixtures import NATS_URL
from tests.support import eventually
from workers.snapshot import BlobCache, ImageRepository, S3Store, SnapshotRepository
from workers.snapshot.errors import ManifestNotFound
from workers.snapshot.gcrun import LEASE_KEY, RepositoryGc
from workers.snapshot.janitor import RepositoryJanitor
from workers.snapshot.manifest import parse_manifest
from workers.snapshot.s3 import S3Config

__all__ = ["s3_endpoint"]

pytestmark = pytest.mark.timeout(90)

KIB, MIB = 1 << 10, 1 << 20
#: the lease's period (the bucket's TTL): a killed holder's lease is free this long after
#: it took it
LEASE_S = 3.0
ORPHAN_IMAGES = 24
ORPHAN_BLOBS = 800
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
async def crash_bus() -> AsyncIterator[Bus]:
    """A namespace of its own: its lease bucket's TTL is this test's, and no other test's
    GC round holds the lease."""
    settings = BusSettings(nats_url=NATS_URL, bus_prefix=f"t{secrets.token_hex(4)}")
    b = await Bus.connect(settings, name="gc-crash")
    try:
        yield b
    finally:
        await delete_all(b.js, settings)
        await b.close()


@pytest.fixture
async def config(s3_endpoint: S3Endpoint) -> S3Config:
    return s3_config(s3_endpoint)


@pytest.fixture
async def repo(config: S3Config, tmp_path: Path) -> AsyncIterator[SnapshotRepository]:
    store = await S3Store.open(config)
    try:
        yield SnapshotRepository(store, BlobCache(tmp_path / "cache", 1 << 30))
    finally:
        await store.close()


async def stored_blobs(repo: SnapshotRepository) -> set[str]:
    return {b.digest async for b in repo.store.iter_blobs()}


async def named(repo: SnapshotRepository) -> dict[str, set[str]]:
    """Each manifest's blobs (one deleted while we list names nothing)."""
    out: dict[str, set[str]] = {}
    for mid in await repo.list():
        try:
            out[mid] = parse_manifest(await repo.store.get_manifest(mid)).blob_digests()
        except ManifestNotFound:  # deleted meanwhile
            continue
    return out


async def dangling(repo: SnapshotRepository) -> dict[str, set[str]]:
    """The manifests that name a blob the store lacks: never allowed, crash or not."""
    blobs = await stored_blobs(repo)
    return {mid: ds - blobs for mid, ds in (await named(repo)).items() if ds - blobs}


async def kill_when(
    bus: Bus, config: S3Config, node: str, mid_way: Callable[[], Awaitable[bool]], lease: Lease
) -> set[str]:
    """Run one GC round in a process of its own and SIGKILL it as soon as `mid_way`;
    who held `lease` meanwhile. Fails if the round finished first (too small a workload)."""
    args = {
        "nats_url": NATS_URL,
        "prefix": bus.settings.bus_prefix,
        "s3": dataclasses.asdict(config),
        "node": node,
        "every_s": LEASE_S,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.bus.gcpass",
        json.dumps(args),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
    )
    holders: set[str] = set()
    try:
        while proc.returncode is None and not await mid_way():
            holders.add(str(await lease.holder()))
            await asyncio.sleep(0.02)
        assert proc.returncode is None, f"the round ended before the kill: {proc.returncode}"
        proc.send_signal(signal.SIGKILL)
        assert await proc.wait() == -signal.SIGKILL
        return holders
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_gc_round_killed_mid_way_is_finished_by_the_next_node(
    crash_bus: Bus, config: S3Config, repo: SnapshotRepository, tmp_path: Path
) -> None:
    bus, run = crash_bus, secrets.token_hex(3)
    images = ImageRepository(repo.store, concurrency=8, chunk_size=64 * KIB)
    # the kept image and a capture taken over it
    make_image(tmp_path / "kept-img", 16 * MIB, [0], zero_at=8 * MIB)
    kept_disk = tmp_path / "kept-img" / "root.ext4"
    kept = await ImageRepository(repo.store).upload_image(
        tmp_path / "kept-img", recipe=secrets.token_hex(32), role="root"
    )
    snap = build_snapshot(tmp_path / "node", f"t-{run}-kept", base=kept_disk)
    doc = json.loads((snap.dir / "manifest.json").read_text())
    doc["base_content"] = kept.manifest.digest
    (snap.dir / "manifest.json").write_text(json.dumps(doc))
    capture = f"t-{run}-kept"
    await repo.upload(snap.dir, base_image_digest="1" * 64, snapshot_id=capture)
    keep = {capture, kept.manifest.key}

    # orphan images of 8 chunks each, every other one published in the log
    async def orphan(i: int) -> str:
        d = tmp_path / f"orphan-{i}"
        d.mkdir()
        (d / "runtime.ext4").write_bytes(os.urandom(MIB // 2))
        up = await images.upload_image(d, recipe=secrets.token_hex(32), role="runtime")
        iid = im.image_aggregate_id(up.manifest.recipe)
        if i % 2 == 0:
            publish = im.PublishImage(
                image_id=iid,
                digest=up.manifest.digest,
                stored_bytes=up.manifest.stored_bytes,
                size=up.manifest.disk.size,
                role="runtime",
            )
            await execute(bus.images, publish)
        return iid

    published = [
        iid
        for i, iid in enumerate(await asyncio.gather(*map(orphan, range(ORPHAN_IMAGES))))
        if i % 2 == 0
    ]
    # and many blobs nobody names (an upload that died before its manifest)
    gate = asyncio.Semaphore(16)

    async def put_unnamed(_: int) -> None:
        data = os.urandom(2 * KIB)
        async with gate:
            await repo.store.put_blob(hashlib.sha256(data).hexdigest(), data)

    await asyncio.gather(*map(put_unnamed, range(ORPHAN_BLOBS)))
    kept_blobs = (await named(repo))[capture] | kept.manifest.blob_digests()
    start = len(await stored_blobs(repo))
    images_at_start = len(await repo.list())
    assert images_at_start == len(keep) + ORPHAN_IMAGES

    # round 1 killed while it deletes the unnamed blobs
    async def deleting_blobs() -> bool:
        return len(await stored_blobs(repo)) < start - 100

    lease = await Lease.open(bus.js, bus.names.gc_lease_bucket, LEASE_KEY, ttl_s=LEASE_S)
    assert "node-1" in await kill_when(bus, config, "node-1", deleting_blobs, lease)
    left = len(await stored_blobs(repo))
    assert left > start - ORPHAN_BLOBS, "round 1 was killed after its blobs were all gone"
    assert await dangling(repo) == {}
    assert kept_blobs <= await stored_blobs(repo)

    # its lease runs out by itself (it lasts a period from its taking, whatever becomes
    # of the holder); round 2 (another node) takes it and is killed while it forgets
    t_kill = time.monotonic()

    async def free() -> bool:
        return await lease.holder() is None

    await eventually(free, timeout=LEASE_S * 2, interval=0.1)
    freed_after = time.monotonic() - t_kill

    async def forgetting() -> bool:
        return len(await repo.list()) < images_at_start - 5

    assert "node-2" in await kill_when(bus, config, "node-2", forgetting, lease)
    assert len(await repo.list()) > len(keep), "round 2 was killed after it forgot all"
    assert await dangling(repo) == {}
    assert kept_blobs <= await stored_blobs(repo)

    # a third node's rounds finish: exactly the blobs the kept manifests name
    janitor = RepositoryJanitor(bus, repo.store)
    gc = RepositoryGc(
        bus, janitor, "node-3", every_s=LEASE_S, min_age=timedelta(0), image_grace=timedelta(0)
    )

    async def finished() -> bool:
        await gc.run_once()
        assert await dangling(repo) == {}
        return set(await repo.list()) == keep and await stored_blobs(repo) == kept_blobs

    await eventually(finished, timeout=LEASE_S * 6, interval=0.5)
    for iid in published:  # each forgotten in the log once, whoever's round did it
        state, _ = await bus.images.load(iid)
        assert state is not None and state.published is None
    print(f"round 1's lease was free {freed_after:.1f}s after its kill")

    # what stays restores bit-for-bit from the store alone
    fresh = SnapshotRepository(repo.store, BlobCache(tmp_path / "cache-2", 1 << 30))
    got = await fresh.download(capture, tmp_path / "restored", kept_disk)
    assert same_content(got.mem, snap.dir / "mem")
    assert sha256(got.state) == sha256(snap.dir / "state")
    image = await ImageRepository(repo.store).download_image(
        kept.manifest.digest, tmp_path / "img-restored"
    )
    assert sha256(image.disk) == sha256(kept_disk)
