"""The boot's working set (issue 29): the first reads of an image on one node become its
trace in the repository, and a node that opens the image later fetches those chunks
ahead, so the same reads there find every chunk cached. Two real service processes, each
with its own empty cache, over one repository (SeaweedFS S3 or a POSIX directory), read
by `qemu-io` with patterns it checks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.contract.snapshot.conftest import s3_endpoint
from tests.integration.blocks.service import BlockService, MiB, run
from tests.integration.blocks.test_block_service import Repo, content, repo, settled
from tests.support import eventually
from workers.snapshot.manifest import MemoryRef, TraceManifest

__all__ = ["repo", "s3_endpoint"]  # the parametrized repository and its SeaweedFS

pytestmark = pytest.mark.skipif(shutil.which("qemu-io") is None, reason="needs qemu-io")

CHUNK = 4 * MiB
CHUNKS = 24
#: (chunk, offset in it, length): scattered, one read across a chunk boundary, one chunk
#: read twice; the trace is their chunks in first-touch order
READS = [(17, 4096, 8192), (3, 0, 65536), (20, CHUNK - 4096, 8192), (9, MiB, 4096), (3, MiB, 512)]
TRACED = [17, 3, 20, 21, 9]
WINDOW_S = 2


def pattern(chunk: int, salt: int) -> int:
    return (chunk * 7 + salt) % 255 + 1


def make_patterned(path: Path, salt: int) -> None:
    """Every chunk filled with a byte of its own (all distinct, none zero)."""
    with path.open("wb") as f:
        for i in range(CHUNKS):
            f.write(bytes([pattern(i, salt)]) * CHUNK)


def commands(salt: int) -> list[str]:
    out: list[str] = []
    for chunk, within, length in READS:
        start = chunk * CHUNK + within
        first = min(length, CHUNK - within)  # a read across a boundary: one pattern each
        out += ["-c", f"read -P {pattern(chunk, salt)} {start} {first}"]
        if first < length:
            out += ["-c", f"read -P {pattern(chunk + 1, salt)} {start + first} {length - first}"]
    return out


async def qemu_io(svc: BlockService, name: str, salt: int) -> None:
    rc, out = await run("qemu-io", "-r", "-f", "raw", *commands(salt), svc.url(name))
    assert rc == 0 and "fail" not in out.lower() and "error" not in out.lower(), out


def node(tmp_path: Path, repo: Repo, which: str, *args: str) -> BlockService:
    d = tmp_path / which
    (d / "cache").mkdir(parents=True)
    return BlockService(
        d / "blocks.sock",
        d / "cache",
        256 * MiB,
        repo.env,
        args=args or ("--trace-seconds", str(WINDOW_S)),
    )


async def test_a_trace_recorded_on_one_node_is_prefetched_on_the_next(
    tmp_path: Path, repo: Repo
) -> None:
    raw, other_raw = tmp_path / "a.raw", tmp_path / "b.raw"
    make_patterned(raw, 0)
    make_patterned(other_raw, 100)
    disk: MemoryRef = await repo.upload(raw)
    other: MemoryRef = await repo.upload(other_raw)
    name = content(disk)

    a = node(tmp_path, repo, "a")
    await a.start()
    try:
        await qemu_io(a, name, 0)

        async def stored() -> TraceManifest | None:
            return await repo.images.get_trace(name)

        trace = await eventually(stored, timeout=WINDOW_S + 15)
        doc_a = await settled(a, trace_recorded=1)
    finally:
        await a.stop()
    assert list(trace.chunks) == TRACED
    assert trace.window_s == WINDOW_S and trace.digest == name
    assert doc_a["trace_loaded"] == 0 and doc_a["prefetched_chunks"] == 0

    b = node(tmp_path, repo, "b")
    await b.start()
    try:
        # the open alone (qemu-img reads no data of a raw image) starts the prefetch
        rc, out = await run("qemu-img", "info", "-f", "raw", b.url(name))
        assert rc == 0, out
        doc = await settled(b, trace_loaded=1, prefetched_chunks=len(TRACED))
        assert doc["prefetched_bytes"] == len(TRACED) * CHUNK
        assert doc["misses"] == 0 and doc["cached_chunks"] == len(TRACED)
        await qemu_io(b, name, 0)
        doc = await settled(b, reads=len(commands(0)) // 2)
        assert doc["misses"] == 0 and doc["hits"] >= len(TRACED)  # every read found its chunk
        assert doc["bytes_fetched"] == len(TRACED) * CHUNK  # nothing fetched twice
        # an image with no trace is served as ever (read whole, byte for byte)
        rc, out = await run(
            "qemu-img", "compare", "-f", "raw", "-F", "raw", str(other_raw), b.url(content(other))
        )
        assert rc == 0 and "identical" in out, out
        doc = await settled(b, misses=CHUNKS)
        assert doc["trace_loaded"] == 1 and doc["prefetched_chunks"] == len(TRACED)
    finally:
        await b.stop()


async def test_a_full_trace_is_stored_before_its_window_ends(tmp_path: Path, repo: Repo) -> None:
    raw = tmp_path / "a.raw"
    make_patterned(raw, 50)
    name = content(await repo.upload(raw))
    a = node(tmp_path, repo, "a", "--trace-seconds", "600", "--trace-chunks", "3")
    await a.start()
    try:
        await qemu_io(a, name, 50)

        async def stored() -> TraceManifest | None:
            return await repo.images.get_trace(name)

        trace = await eventually(stored, timeout=15)  # not 600 s: at its third chunk
    finally:
        await a.stop()
    assert list(trace.chunks) == TRACED[:3]
