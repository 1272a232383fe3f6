"""The block service (issue 29) measured from the host with QEMU's own NBD client, no VM:
`python -m bench.blocks_bench [--mib 512] [--random 400]`.

One image of random bytes (every chunk has data: the cold rows fetch all of it), read by
`qemu-img bench` (sequential, 1 MiB requests, 8 in flight) and `qemu-io` (random reads of
`--block` KiB, 64 by default, aligned, one at a time: latency and IOPS at queue depth 1; the
same offsets for every row) from:

  local        the raw file itself (in the page cache, as the warm chunk files are)
  qemu_nbd     `qemu-nbd -r` serving that file on a unix socket: the C ceiling of NBD here
  nbdkit       `nbdkit -r file` on a unix socket (when nbdkit is installed)
  blocks_warm  our service, every chunk in its cache
  blocks_cold  our service with an empty cache, chunks fetched from the repository
               (a POSIX directory, and SeaweedFS S3 as `aenv up` runs it); sequentially
               also with `--readahead 4`

One run; the figures go to bench/results/blocks.json. `--warm-only` skips the cold rows
(the warm read path alone, quicker to repeat).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from aenv.roles.blocks import READY
from aenv.stack import EmbeddedS3
from bench.stats import emit, summary
from workers.snapshot import (
    ImageFiles,
    ImageRepository,
    PosixStore,
    S3Config,
    S3Store,
    SnapshotStore,
)

MiB = 1 << 20
S3_BUCKET = "aenv-blocks-bench"
#: chunks fetched ahead in the readahead row (`--readahead`)
READAHEAD = 4

_RUN = re.compile(r"Run completed in ([\d.]+) seconds")
_OPS = re.compile(r", 1 ops; [^(]*\([^)]* and ([\d.]+) ops/sec\)")  # whatever its time format


def run_seconds(out: str) -> float:
    """The run's time from `qemu-img bench`'s output."""
    m = _RUN.search(out)
    if m is None:
        raise ValueError(f"no run time in {out!r}")
    return float(m.group(1))


def op_seconds(out: str) -> list[float]:
    """Each op's time from `qemu-io`'s output: 1 / its ops/sec (its own seconds field has
    two decimals only)."""
    return [1 / float(m.group(1)) for m in _OPS.finditer(out)]


def seq_read(target: list[str], size: int) -> dict[str, Any]:
    """`qemu-img bench`: the whole image in 1 MiB reads, 8 in flight."""
    count = size // MiB
    out = subprocess.run(
        ["qemu-img", "bench", "-c", str(count), "-d", "8", "-s", "1M", "-S", "1M", *target],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    seconds = run_seconds(out)
    return {"seconds": seconds, "mb_s": round(count * MiB / seconds / 1e6, 1)}


def random_reads(target: list[str], offsets: list[int], block: int) -> dict[str, Any]:
    """`qemu-io`: one read of `block` bytes per offset, one at a time; each op's own time
    (qemu-io's ops/sec of that op), so process start-up does not count."""
    cmds = [a for off in offsets for a in ("-c", f"read {off} {block}")]
    out = subprocess.run(
        ["qemu-io", "-r", *target, *cmds], check=True, capture_output=True, text=True
    ).stdout
    lat = op_seconds(out)
    assert len(lat) == len(offsets), out[-500:]
    return {"iops_qd1": round(len(lat) / sum(lat)), "latency": summary(lat)}


def file_target(path: Path) -> list[str]:
    return ["-f", "raw", str(path)]


def nbd_target(socket: Path, export: str) -> list[str]:
    return ["-f", "raw", f"nbd+unix:///{export}?socket={socket}"]


@contextlib.contextmanager
def process(argv: list[str], socket: Path, env: dict[str, str] | None = None) -> Iterator[None]:
    """A server on `socket`, up once the socket accepts."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} did not start")
            time.sleep(0.02)
        time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def blocks(
    socket: Path, cache: Path, cache_bytes: int, env: dict[str, str], readahead: int = 0
) -> Iterator[Path]:
    """Our service as the node runs it; yields its cache dir (stats.json)."""
    cache.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "aenv.roles.blocks", "serve", "--socket", str(socket)]
    argv += ["--cache-dir", str(cache), "--cache-bytes", str(cache_bytes)]
    argv += ["--readahead", str(readahead)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line.startswith(READY):
            raise RuntimeError(f"blocks did not start: {line!r}")
        yield cache
    finally:
        proc.terminate()
        proc.wait(10)


def stats(cache: Path) -> dict[str, Any]:
    time.sleep(1.2)  # rewritten about once a second
    doc: dict[str, Any] = json.loads((cache / "stats.json").read_text())
    keys = ("bytes_fetched", "fetch_seconds_total", "misses", "hits", "prefetches")
    return {k: doc[k] for k in keys}


def make_image(path: Path, size: int) -> None:
    with path.open("wb") as f:
        for _ in range(size // (4 * MiB)):
            f.write(os.urandom(4 * MiB))


async def upload(store: SnapshotStore, disk: Path) -> str:
    up = await ImageRepository(store).upload_image(
        ImageFiles(disk), recipe=os.urandom(32).hex(), role="root"
    )
    return up.manifest.digest


@contextlib.asynccontextmanager
async def seaweed(work: Path) -> AsyncIterator[tuple[S3Store, dict[str, str]]]:
    svc = EmbeddedS3(work / "s3")
    ep = await svc.start()
    store = await S3Store.open(
        S3Config(
            bucket=S3_BUCKET,
            endpoint_url=ep.url,
            access_key=ep.access_key,
            secret_key=ep.secret_key,
            region=ep.region,
        )
    )
    env = {
        "AENV_S3_ENDPOINT": ep.url,
        "AENV_S3_ACCESS_KEY": ep.access_key,
        "AENV_S3_SECRET_KEY": ep.secret_key,
        "AENV_S3_BUCKET": S3_BUCKET,
    }
    try:
        yield store, env
    finally:
        await store.close()
        await svc.process.stop(timeout=1.0)


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AENV_")}


def measure_blocks(
    work: Path,
    name: str,
    env: dict[str, str],
    export: str,
    size: int,
    offsets: list[int],
    *,
    block: int,
    warm_only: bool = False,
) -> dict[str, Any]:
    """Cold sequential with readahead, then cold sequential and cold random (each on an
    empty cache), and warm both; `warm_only`: the warm rows only (the cache filled by a
    sequential read first)."""
    sock = work / f"{name}.sock"
    out: dict[str, Any] = {}
    if not warm_only:
        cache = work / f"cache-{name}-ahead"
        with blocks(sock, cache, 2 * size, env, readahead=READAHEAD):
            got = seq_read(nbd_target(sock, export), size)
            out["cold_seq_readahead"] = {**got, "readahead": READAHEAD, "stats": stats(cache)}
        shutil.rmtree(cache, ignore_errors=True)
    for kind in ("seq",) if warm_only else ("seq", "random"):
        cache = work / f"cache-{name}-{kind}"
        with blocks(sock, cache, 2 * size, env):
            got = (
                seq_read(nbd_target(sock, export), size)
                if kind == "seq"
                else random_reads(nbd_target(sock, export), offsets, block)
            )
            if not warm_only:
                out[f"cold_{kind}"] = {**got, "stats": stats(cache)}
        if kind == "seq":  # that cache now holds every chunk: the warm rows read it
            with blocks(sock, cache, 2 * size, env):
                out["warm_seq"] = seq_read(nbd_target(sock, export), size)
                out["warm_random"] = random_reads(nbd_target(sock, export), offsets, block)
                out["warm_stats"] = stats(cache)
        shutil.rmtree(cache, ignore_errors=True)
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    size = args.mib * MiB
    rng = random.Random(29)
    block = args.block * 1024
    offsets = [rng.randrange(size // block) * block for _ in range(args.random)]
    work = Path(tempfile.mkdtemp(prefix="blocks-bench-", dir=args.dir))
    try:
        raw = work / "disk.raw"
        make_image(raw, size)
        rows: dict[str, Any] = {}
        rows["local"] = {
            "seq": seq_read(file_target(raw), size),
            "random": random_reads(file_target(raw), offsets, block),
        }
        sock = work / "qemu-nbd.sock"
        argv = ["qemu-nbd", "-r", "-t", "-f", "raw", "-x", "d", "-k", str(sock), str(raw)]
        with process(argv, sock):
            rows["qemu_nbd"] = {
                "seq": seq_read(nbd_target(sock, "d"), size),
                "random": random_reads(nbd_target(sock, "d"), offsets, block),
            }
        if shutil.which("nbdkit"):
            sock = work / "nbdkit.sock"
            with process(["nbdkit", "-f", "-r", "-U", str(sock), "file", f"file={raw}"], sock):
                rows["nbdkit"] = {
                    "seq": seq_read(nbd_target(sock, ""), size),
                    "random": random_reads(nbd_target(sock, ""), offsets, block),
                }
        else:
            rows["nbdkit"] = {"skipped": "nbdkit not installed"}
        posix = PosixStore(work / "store")
        digest = await upload(posix, raw)
        env = {**base_env(), "AENV_SNAPSHOT_DIR": str(work / "store")}
        rows["blocks_posix"] = await asyncio.to_thread(
            measure_blocks,
            work,
            "posix",
            env,
            digest,
            size,
            offsets,
            block=block,
            warm_only=args.warm_only,
        )
        if not args.no_s3:
            async with seaweed(work) as (s3, s3_env):
                await upload(s3, raw)
                rows["blocks_s3"] = await asyncio.to_thread(
                    measure_blocks,
                    work,
                    "s3",
                    {**base_env(), **s3_env},
                    digest,
                    size,
                    offsets,
                    block=block,
                    warm_only=args.warm_only,
                )
        return {
            "image_mib": args.mib,
            "random_reads": args.random,
            "seq_request": "1 MiB, 8 in flight (qemu-img bench)",
            "random_request": f"{args.block} KiB aligned, queue depth 1 (qemu-io)",
            "rows": rows,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def cli() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.blocks_bench")
    p.add_argument("--mib", type=int, default=512, help="image size (MiB, a multiple of 4)")
    p.add_argument("--random", type=int, default=400, help="random reads per row")
    p.add_argument("--block", type=int, default=64, help="random read size (KiB)")
    p.add_argument("--warm-only", action="store_true", help="skip the cold rows")
    p.add_argument("--dir", default=None, help="where the image and caches go")
    p.add_argument("--no-s3", action="store_true", help="skip the SeaweedFS cold rows")
    emit("blocks", asyncio.run(main(p.parse_args())))


if __name__ == "__main__":
    cli()
