"""Snapshot repository benchmark: upload/download throughput to SeaweedFS S3 and to posix.

Every figure sits next to a raw `cp --sparse=always` of the same files in the same run,
so the ratio shows what content addressing, hashing, chunking and the store add over a
plain local copy. The snapshot is realistic: a 512 MiB sparse RAM file with ~128 MiB of
data, 1 MiB of device state, and a 3-layer qcow2 chain (~96 MiB written) over a raw base.
Run: `python -m bench.snapshot_bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aenv.stack import EmbeddedS3
from bench.stats import emit, ratio, summary
from workers.snapshot import (
    BlobCache,
    PosixStore,
    S3Config,
    S3Store,
    SnapshotRepository,
    SnapshotStore,
    walk_chain,
)

MIB = 1 << 20
MEM_SIZE = 512 * MIB
MEM_DATA = 128 * MIB  # what a booted 512 MiB guest typically has touched
BASE_DIGEST = "0" * 64


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def build(root: Path) -> Path:
    """A node snapshot directory (state, mem, manifest.json) and its disk chain."""
    root.mkdir(parents=True)
    base = root / "base.raw"
    with open(base, "wb") as f:
        f.truncate(256 * MIB)
    layers: list[Path] = []
    for i, off in enumerate((0, 64, 160)):
        layer = root / f"l{i}.qcow2"
        below, fmt = (base, "raw") if not layers else (layers[-1], "qcow2")
        _run("qemu-img", "create", "-q", "-f", "qcow2", "-b", str(below), "-F", fmt, str(layer))
        _run("qemu-io", "-f", "qcow2", "-c", f"write -P 0x{i + 1:02x} {off}M 32M", str(layer))
        layers.append(layer)
    snap = root / "snap"
    snap.mkdir()
    (snap / "state").write_bytes(os.urandom(MIB))
    with open(snap / "mem", "wb") as f:
        f.truncate(MEM_SIZE)
        step = MEM_SIZE // (MEM_DATA // (4 * MIB))
        for off in range(0, MEM_SIZE, step):  # 4 MiB islands spread over all of RAM
            f.seek(off)
            f.write(os.urandom(4 * MIB))
    doc = (
        '{"format": 1, "snapshot_id": "bench", "machine": {}, "fingerprint": "bench", '
        f'"disk_top": "{layers[-1]}", "base_image": "{base}", "parent_vm": null}}'
    )
    (snap / "manifest.json").write_text(doc)
    return snap


def data_bytes(snap: Path) -> int:
    layers, _ = walk_chain(snap.parent / "l2.qcow2")
    files = [snap / "state", snap / "mem", *layers]
    return sum(os.stat(f).st_blocks * 512 for f in files)


def raw_copy(snap: Path, dest: Path) -> float:
    """The primitive: copy the same files with cp, holes preserved."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    files = [snap / "state", snap / "mem", *sorted(snap.parent.glob("l*.qcow2"))]
    t0 = time.monotonic()
    _run("cp", "--sparse=always", *map(str, files), str(dest))
    _run("sync", "-f", str(dest))
    return time.monotonic() - t0


async def timed(op: Awaitable[Any]) -> float:
    t0 = time.monotonic()
    await op
    return time.monotonic() - t0


def touch_one_page(mem: Path) -> None:
    """What a second pause of the same sandbox sees: one guest page changed."""
    with open(mem, "r+b") as f:
        f.seek(4096)
        f.write(os.urandom(4096))


async def measure(
    name: str,
    make_store: Callable[[str], Awaitable[SnapshotStore]],
    snap: Path,
    work: Path,
    rounds: int,
    mib: float,
    cp: dict[str, Any],
) -> dict[str, Any]:
    up, up_again, up_incr, down_cold, down_warm = [], [], [], [], []
    base = snap.parent / "base.raw"
    for r in range(rounds):
        store = await make_store(f"r{r}")
        cache = BlobCache(work / f"{name}-cache-{r}", 4 << 30)
        repo = SnapshotRepository(store, cache)
        up.append(await timed(repo.upload(snap, base_image_digest=BASE_DIGEST)))
        up_again.append(await timed(repo.upload(snap, base_image_digest=BASE_DIGEST)))
        dest = work / f"{name}-dl-{r}"
        down_cold.append(await timed(repo.download("bench", dest, base)))
        down_warm.append(await timed(repo.download("bench", dest, base)))
        touch_one_page(snap / "mem")
        up_incr.append(
            await timed(repo.upload(snap, base_image_digest=BASE_DIGEST, snapshot_id=f"b{r}"))
        )
        await store.close()
        shutil.rmtree(dest, ignore_errors=True)
        shutil.rmtree(cache.root, ignore_errors=True)
    out: dict[str, Any] = {}
    for key, xs in (
        ("upload", up),
        ("reupload_all_present", up_again),
        ("upload_one_page_changed", up_incr),
        ("download_cold", down_cold),
        ("download_cached", down_warm),
    ):
        s = summary(xs)
        out[key] = {
            **s,
            "MBps_p50": round(mib / (s["p50"] / 1000), 1),
            "vs_cp": ratio(s, cp),
        }
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="aenv-snapbench-", dir="/var/tmp"))
    s3 = EmbeddedS3(work / "s3data")
    try:
        snap = build(work / "src")
        mib = data_bytes(snap) / MIB
        cp = summary([raw_copy(snap, work / "cp") for _ in range(args.rounds)])
        ep = await s3.start()

        async def s3_store(tag: str) -> SnapshotStore:
            return await S3Store.open(
                S3Config(
                    bucket="bench",
                    endpoint_url=ep.url,
                    access_key=ep.access_key,
                    secret_key=ep.secret_key,
                    region=ep.region,
                    prefix=tag,
                )
            )

        async def posix_store(tag: str) -> SnapshotStore:
            return PosixStore(work / "posix" / tag)

        return {
            "snapshot": {
                "mem_apparent_MiB": MEM_SIZE // MIB,
                "data_MiB": round(mib, 1),
                "note": "MB/s = allocated bytes of state+mem+layers per second",
            },
            "cp_sparse": {**cp, "MBps_p50": round(mib / (cp["p50"] / 1000), 1)},
            "s3_seaweedfs": await measure("s3", s3_store, snap, work, args.rounds, mib, cp),
            "posix": await measure("posix", posix_store, snap, work, args.rounds, mib, cp),
        }
    finally:
        await s3.process.stop(timeout=2.0)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    emit("snapshot", asyncio.run(main(parser.parse_args())))
