"""The block service's process: `python -m aenv.roles.blocks serve --socket --cache-dir
--cache-bytes` (issue 29).

Serves the repository's images over NBD on a unix socket, read-only, each export named by
an image's content digest, for the QEMUs of this node; chunks come from the repository on
first read into a cache under `--cache-dir` (`workers/snapshot/blocks/`). The repository is
the node's (`AENV_S3_*`, else `AENV_SNAPSHOT_DIR`), built as `aenv/roles/node.py` builds it.

A process of its own, so a crash of it is one restart away (the node supervises it; QEMU
reconnects) and its loop never waits behind the node's. It keeps nothing a restart needs
but the chunk files: its counters start afresh. Writes `<cache dir>/blocks.pid`, and one
line `blocks: serving on <socket>` on stdout once it accepts clients.

The cache's cap is `--cache-bytes` unless the node set one in `<cache dir>/cap`, which is
read again about once a second (the node fits it to its disk budget as that changes:
`shared/blockcap.py`).

The first reads of an image with no trace in the repository are recorded as its trace
(`--trace-seconds`, `--trace-chunks`); an image with one has its chunks fetched ahead on
its first open here (`--prefetch-concurrency`): `workers/snapshot/blocks/workingset.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from aenv import eventloop, logs
from aenv.roles.common import RoleSettings
from shared.blockcap import read_cap
from workers.snapshot import ImageRepository, PosixStore, S3Config, S3Store, SnapshotStore
from workers.snapshot.blocks.chunkcache import ChunkCache
from workers.snapshot.blocks.export import Exports
from workers.snapshot.blocks.server import BlockServer
from workers.snapshot.blocks.stats import FILE as STATS_FILE
from workers.snapshot.blocks.stats import BlockStats, write_stats, write_stats_every
from workers.snapshot.blocks.trace import TraceSettings
from workers.snapshot.blocks.workingset import WorkingSets

__all__ = ["follow_cap", "main", "serve"]

log = logging.getLogger(__name__)

READY = "blocks: serving on"


async def open_store(cfg: RoleSettings) -> SnapshotStore | None:
    """The node's repository store (`aenv/roles/node.py::_repository`): S3 when an endpoint
    is set, else the shared directory; None when neither is."""
    if cfg.s3_endpoint:
        return await S3Store.open(
            S3Config(
                bucket=cfg.s3_bucket,
                endpoint_url=cfg.s3_endpoint,
                access_key=cfg.s3_access_key,
                secret_key=cfg.s3_secret_key,
                create_bucket=False,  # reading only: the node made it
            )
        )
    if cfg.snapshot_dir is not None:
        return PosixStore(cfg.snapshot_dir)
    return None


async def serve(
    socket: Path,
    cache_dir: Path,
    cache_bytes: int,
    cfg: RoleSettings,
    stop: asyncio.Event,
    *,
    readahead: int = 0,
    traces: TraceSettings | None = None,
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        store = await open_store(cfg)
        if store is None:
            raise SystemExit("blocks: no repository (set AENV_S3_ENDPOINT or AENV_SNAPSHOT_DIR)")
        stack.push_async_callback(store.close)
        cache_dir.mkdir(parents=True, exist_ok=True)
        pid = cache_dir / "blocks.pid"
        pid.write_text(f"{os.getpid()}\n")
        stack.callback(pid.unlink, missing_ok=True)
        cap = read_cap(cache_dir)  # the node's latest (`shared/blockcap.py`), if it set one
        cache = ChunkCache(cache_dir, store, cache_bytes if cap is None else cap)
        stack.callback(cache.close)
        stats = BlockStats(cache)
        images = ImageRepository(store)
        sets = WorkingSets(images, stats, traces or TraceSettings())
        stack.push_async_callback(sets.close)
        exports = Exports(images, cache, stats, readahead=readahead, on_open=sets.opened)
        server = BlockServer(socket, exports, stats)
        await server.start()
        stack.push_async_callback(server.stop)
        write_stats(cache_dir / STATS_FILE, stats.snapshot())  # this run's, before "serving"
        writer = asyncio.create_task(write_stats_every(stats, cache_dir))
        stack.callback(writer.cancel)
        capping = asyncio.create_task(follow_cap(cache, cache_dir))
        stack.callback(capping.cancel)
        log.info(
            "blocks: serving on %s (cache %s, %d of %d bytes held)",
            socket,
            cache_dir,
            cache.cached_bytes,
            cache.cap_bytes,
        )
        print(f"{READY} {socket}", flush=True)
        await stop.wait()
        log.info("blocks: stopping")
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer


async def follow_cap(cache: ChunkCache, cache_dir: Path, every_s: float = 1.0) -> None:
    """Take the cap the node sets (`shared/blockcap.py`) whenever it changes."""
    while True:
        cap = read_cap(cache_dir)
        if cap is not None and cap != cache.cap_bytes:
            log.info("blocks: cache cap %d -> %d MiB", cache.cap_bytes >> 20, cap >> 20)
            cache.set_cap(cap)
        await asyncio.sleep(every_s)


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m aenv.roles.blocks")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the repository's images over NBD on a unix socket")
    s.add_argument("--socket", type=Path, required=True)
    s.add_argument("--cache-dir", type=Path, required=True)
    s.add_argument("--cache-bytes", type=int, required=True)
    s.add_argument(
        "--readahead",
        type=int,
        default=0,
        help="chunks fetched ahead of a sequential reader (default 0: only what is read)",
    )
    d = TraceSettings()
    s.add_argument(
        "--trace-seconds",
        type=float,
        default=d.window_s,
        help="an image with no trace records the chunks read this long after its first open "
        f"here, as its trace (default {d.window_s:g}; 0: never record)",
    )
    s.add_argument(
        "--trace-chunks",
        type=int,
        default=d.limit,
        help=f"chunks a recorded trace holds at most (default {d.limit})",
    )
    s.add_argument(
        "--prefetch-concurrency",
        type=int,
        default=d.concurrency,
        help="fetches in flight while a trace's chunks are fetched ahead, demand fetches "
        f"included (default {d.concurrency}; 0: no prefetch)",
    )
    s.add_argument(
        "--prefetch-protect-seconds",
        type=float,
        default=d.protect_s,
        help="a prefetch stops rather than evict a chunk used this recently "
        f"(default {d.protect_s:g})",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = _args(argv)
    logs.configure("aenv-blocks")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(
            args.socket,
            args.cache_dir,
            args.cache_bytes,
            RoleSettings(),
            stop,
            readahead=args.readahead,
            traces=TraceSettings(
                window_s=args.trace_seconds,
                limit=args.trace_chunks,
                concurrency=args.prefetch_concurrency,
                protect_s=args.prefetch_protect_seconds,
            ),
        )

    eventloop.run(run())


if __name__ == "__main__":
    main(sys.argv[1:])
