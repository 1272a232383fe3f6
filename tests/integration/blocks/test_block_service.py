"""The block service (issue 29) as a real process over a real repository (SeaweedFS S3 or a
POSIX directory), read by QEMU's own NBD client (`qemu-img`, `qemu-io`): what a node's
VMs will do, without the VMs. Each image is uploaded as the fleet uploads images
(`ImageRepository.upload_image`), then served by its content digest."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aenv.stack import S3Endpoint
from shared.diskdigest import disk_digest
from tests.contract.snapshot.conftest import s3_endpoint
from tests.integration.blocks.service import (
    BlockService,
    MiB,
    make_image,
    run,
    service_env,
    sha256,
)
from tests.support import eventually
from workers.snapshot import ImageFiles, ImageRepository, PosixStore, S3Config, S3Store
from workers.snapshot.manifest import MemoryRef

__all__ = ["s3_endpoint"]  # the session's SeaweedFS, shared with the snapshot contract

pytestmark = pytest.mark.skipif(shutil.which("qemu-img") is None, reason="needs qemu-img")

#: The service reads the bucket the node names (no key prefix): one of its own for these tests
BUCKET = "aenv-blocks-test"


class Repo:
    def __init__(self, images: ImageRepository, env: dict[str, str]):
        self.images = images
        self.env = env

    async def upload(self, disk: Path) -> MemoryRef:
        up = await self.images.upload_image(
            ImageFiles(disk), recipe=uuid.uuid4().hex * 2, role="root"
        )
        return up.manifest.disk


@pytest.fixture(params=["posix", "s3"])
async def repo(
    request: pytest.FixtureRequest, tmp_path: Path, s3_endpoint: S3Endpoint
) -> AsyncIterator[Repo]:
    if request.param == "posix":
        store = PosixStore(tmp_path / "store")
        env = service_env("posix", str(tmp_path / "store"))
    else:
        store = await S3Store.open(
            S3Config(
                bucket=BUCKET,
                endpoint_url=s3_endpoint.url,
                access_key=s3_endpoint.access_key,
                secret_key=s3_endpoint.secret_key,
                region=s3_endpoint.region,
            )
        )
        ep = {
            "url": s3_endpoint.url,
            "access_key": s3_endpoint.access_key,
            "secret_key": s3_endpoint.secret_key,
            "bucket": BUCKET,
        }
        env = service_env("s3", json.dumps(ep))
    try:
        yield Repo(ImageRepository(store), env)
    finally:
        await store.close()


@pytest.fixture
async def posix_repo(tmp_path: Path) -> AsyncIterator[Repo]:
    store = PosixStore(tmp_path / "store")
    yield Repo(ImageRepository(store), service_env("posix", str(tmp_path / "store")))


def service(tmp_path: Path, repo: Repo, cache_bytes: int) -> BlockService:
    (tmp_path / "cache").mkdir(exist_ok=True)
    return BlockService(tmp_path / "blocks.sock", tmp_path / "cache", cache_bytes, repo.env)


def content(disk: MemoryRef) -> str:
    return disk_digest(disk.size, disk.chunk_size, disk.chunks)


def data_bytes(disk: MemoryRef) -> int:
    return sum(disk.chunk_len(i) for i, c in enumerate(disk.chunks) if c is not None)


async def settled(svc: BlockService, **want: int) -> dict[str, object]:
    """stats.json once its counters reach `want` (it is rewritten about once a second)."""

    async def probe() -> dict[str, object] | None:
        doc = svc.stats()
        return doc if all(doc[k] >= v for k, v in want.items()) else None

    return await eventually(probe, timeout=10)


async def test_a_cold_image_reads_identical_through_a_cache_smaller_than_it(
    tmp_path: Path, repo: Repo
) -> None:
    raw = tmp_path / "disk.raw"
    make_image(raw, 256 * MiB, seed=1, regions=24)
    disk = await repo.upload(raw)
    name = content(disk)
    svc = service(tmp_path, repo, 64 * MiB)
    await svc.start()
    try:
        rc, out = await run(
            "qemu-img", "compare", "-f", "raw", "-F", "raw", str(raw), svc.url(name)
        )
        assert rc == 0 and "identical" in out, out
        want = data_bytes(disk)
        assert want > 64 * MiB  # the cache must evict to get through
        doc = await settled(svc, bytes_read=disk.size)
    finally:
        await svc.stop()
    # each chunk with data fetched once (the compare reads in order), zero chunks never
    assert doc["bytes_fetched"] == want
    assert doc["misses"] == sum(c is not None for c in disk.chunks)
    assert doc["evictions"] > 0 and doc["cached_bytes"] <= 64 * MiB
    assert doc["exports"] == {
        name: {
            "size": disk.size,
            "bytes_fetched": want,
            "reads": doc["reads"],
            "bytes_read": disk.size,
        }
    }
    assert float(doc["fetch_seconds_total"]) > 0  # type: ignore[arg-type]


async def test_a_second_image_sharing_most_chunks_fetches_only_its_own(
    tmp_path: Path, posix_repo: Repo
) -> None:
    a_raw, b_raw = tmp_path / "a.raw", tmp_path / "b.raw"
    make_image(a_raw, 128 * MiB, seed=2, regions=40)
    shutil.copyfile(a_raw, b_raw)
    with b_raw.open("r+b") as f:  # b: a's bytes with two chunks changed
        for offset in (8 * MiB + 100, 100 * MiB):
            f.seek(offset)
            f.write(os.urandom(MiB))
    a, b = await posix_repo.upload(a_raw), await posix_repo.upload(b_raw)
    own = {c for c in b.chunks if c is not None} - set(a.chunks)
    assert len(own) == 2
    svc = service(tmp_path, posix_repo, 512 * MiB)
    await svc.start()
    try:
        for raw, disk in ((a_raw, a), (b_raw, b)):
            url = svc.url(content(disk))
            rc, out = await run("qemu-img", "compare", "-f", "raw", "-F", "raw", str(raw), url)
            assert rc == 0 and "identical" in out, out
        doc = await settled(svc, bytes_read=a.size + b.size)
    finally:
        await svc.stop()
    exports = doc["exports"]
    assert isinstance(exports, dict)
    assert exports[content(a)]["bytes_fetched"] == data_bytes(a)
    assert exports[content(b)]["bytes_fetched"] == 2 * 4 * MiB  # its own two chunks, no more
    assert doc["bytes_fetched"] == data_bytes(a) + 2 * 4 * MiB


async def test_a_killed_service_comes_back_on_its_socket_and_qemu_reconnects(
    tmp_path: Path, posix_repo: Repo
) -> None:
    """kill -9 while a QEMU client holds a connection: a client with `reconnect-delay`
    reads again once the service is back (same socket), correctly; the restarted service
    keeps the chunks it had; a fresh whole read is identical. (qemu-io 7.2 then hangs in
    `quit` after any reconnect, over qemu-nbd too: it is killed here, not asked to quit.)"""
    raw = tmp_path / "disk.raw"
    make_image(raw, 64 * MiB, seed=3, regions=12)
    disk = await posix_repo.upload(raw)
    name = content(disk)
    svc = service(tmp_path, posix_repo, 256 * MiB)
    await svc.start()
    opts = f"driver=nbd,server.type=unix,server.path={svc.socket},export={name},reconnect-delay=10"
    qio = await asyncio.create_subprocess_exec(
        "qemu-io",
        "-r",
        "--image-opts",
        opts,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert qio.stdin is not None and qio.stdout is not None
    first, second = _data_offset(disk, 0), _data_offset(disk, 1)
    try:
        qio.stdin.write(f"read -v {first} 64\n".encode())
        await qio.stdin.drain()
        got_first = await _dump(qio.stdout, 64)
        pid = int((svc.cache_dir / "blocks.pid").read_text())
        await svc.kill9()
        assert svc.proc is not None and pid == svc.proc.pid
        await svc.start()  # the same socket path, a stale socket file left behind
        assert svc.stats()["cached_chunks"] >= 1  # what it fetched before survives
        qio.stdin.write(f"read -v {second} 64\n".encode())
        await qio.stdin.drain()
        got_second = await asyncio.wait_for(_dump(qio.stdout, 64), 30)
        with raw.open("rb") as f:
            assert got_first == os.pread(f.fileno(), 64, first)
            assert got_second == os.pread(f.fileno(), 64, second)
        rc, out = await run(
            "qemu-img", "compare", "-f", "raw", "-F", "raw", str(raw), svc.url(name)
        )
        assert rc == 0 and "identical" in out, out
    finally:
        if qio.returncode is None:
            qio.send_signal(signal.SIGKILL)
            await qio.wait()
        await svc.stop()


async def test_an_unknown_export_fails_the_open_and_the_service_goes_on(
    tmp_path: Path, posix_repo: Repo
) -> None:
    raw = tmp_path / "disk.raw"
    make_image(raw, 16 * MiB, seed=4, regions=3)
    disk = await posix_repo.upload(raw)
    svc = service(tmp_path, posix_repo, 64 * MiB)
    await svc.start()
    try:
        for bad in ("0" * 64, "not-a-digest"):
            rc, out = await run("qemu-img", "info", "-f", "raw", svc.url(bad), timeout=30)
            assert rc != 0 and "export not available" in out, out
        rc, out = await run(
            "qemu-img", "compare", "-f", "raw", "-F", "raw", str(raw), svc.url(content(disk))
        )
        assert rc == 0 and "identical" in out, out
        assert svc.proc is not None and svc.proc.returncode is None  # still serving
    finally:
        await svc.stop()


def _data_offset(disk: MemoryRef, nth: int) -> int:
    """The start of the `nth` chunk that holds data."""
    return [i for i, c in enumerate(disk.chunks) if c is not None][nth] * disk.chunk_size


async def _dump(out: asyncio.StreamReader, n: int) -> bytes:
    """The bytes of one `read -v` hex dump of `n` bytes from qemu-io's output."""
    got = bytearray()
    while len(got) < n:
        line = (await out.readline()).decode()
        if not line:
            raise AssertionError("qemu-io ended before its dump")
        if "read failed" in line or "error" in line.lower():
            raise AssertionError(f"qemu-io: {line.strip()}")
        head, sep, rest = line.partition(":  ")
        if sep and head.strip().split()[-1].isalnum():
            got += bytes.fromhex(rest[: 16 * 3])
    return bytes(got)


async def test_a_whole_read_in_flight_survives_a_kill_through_qemu_reconnect(
    tmp_path: Path, posix_repo: Repo
) -> None:
    """kill -9 in the middle of a cold `qemu-img convert` whose NBD client has a
    `reconnect-delay`: its requests wait for the restarted service, the copy completes
    and is byte-identical (what a VM's base disk will see)."""
    raw = tmp_path / "disk.raw"
    with raw.open("wb") as f:
        for _ in range(64):
            f.write(os.urandom(4 * MiB))
    disk = await posix_repo.upload(raw)
    svc = service(tmp_path, posix_repo, 512 * MiB)
    await svc.start()
    opts = (
        f"driver=raw,file.driver=nbd,file.server.type=unix,file.server.path={svc.socket},"
        f"file.export={content(disk)},file.reconnect-delay=10"
    )
    out = tmp_path / "copy.raw"
    copy = await asyncio.create_subprocess_exec(
        "qemu-img", "convert", "--image-opts", opts, "-O", "raw", str(out),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await asyncio.sleep(0.3)
        assert copy.returncode is None  # still reading: the kill lands mid-copy
        await svc.kill9()
        await svc.start()
        _, err = await asyncio.wait_for(copy.communicate(), 60)
        assert copy.returncode == 0, err
        assert sha256(out) == sha256(raw)
    finally:
        if copy.returncode is None:
            copy.kill()
            await copy.wait()
        await svc.stop()


async def test_many_clients_at_once_through_a_small_cache_all_read_identical(
    tmp_path: Path, posix_repo: Repo
) -> None:
    """Four `qemu-img compare` at once over two images through a cache of four chunks:
    reads of one chunk share a fetch, pinned chunks outlive the cap, every reply stays
    framed; each client sees its image byte for byte."""
    raws = [tmp_path / "a.raw", tmp_path / "b.raw"]
    make_image(raws[0], 64 * MiB, seed=5, regions=16)
    make_image(raws[1], 64 * MiB, seed=6, regions=16)
    disks = [await posix_repo.upload(r) for r in raws]
    svc = service(tmp_path, posix_repo, 16 * MiB)
    await svc.start()
    try:
        results = await asyncio.gather(
            *(
                run("qemu-img", "compare", "-f", "raw", "-F", "raw", str(raw), svc.url(content(d)))
                for raw, d in [*zip(raws, disks, strict=True)] * 2
            )
        )
        for rc, out in results:
            assert rc == 0 and "identical" in out, out
        doc = await settled(svc, bytes_read=4 * 64 * MiB)
    finally:
        await svc.stop()
    assert doc["read_errors"] == 0 and doc["evictions"] > 0
    assert doc["cached_bytes"] <= 16 * MiB  # over the cap only while reads pinned chunks
