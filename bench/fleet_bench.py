"""Fleet benchmark: creates with 1 node vs 3 nodes on one machine, and the event log at R1
vs R3.

- creates: a fleet of `bench.fleetrig` (3-server NATS cluster at R3, one API, 1 or 3 node
  processes with real microVMs) takes 8 creates one at a time (latency, beside the raw
  restore), then `--creates` sandboxes through the unchanged `e2b` SDK, `--concurrency` at
  a time: creates/s, create latency p50/p99 under that load, and where they landed
  (placement skew: the most on one node over the mean). Beside it, in the same run, the raw
  primitive: QEMU restoring the same guest with no control plane (`runtime_bench`'s raw
  restore, to envd answering). This machine has 2 cores and TCG: more node processes share
  the same two cores, so 3 nodes cannot be faster here — what the figure shows is that
  spreading over nodes costs nothing and that placement spreads.
- bus: decisions appended the way the node appends them (`events_bench.append_phase`) and
  then folded by a projector in its own process, on the machine's single NATS server (R1)
  and on the cluster (R3): events/s and append latency p50/p99.

Run as root: `python -m bench.fleet_bench [--creates 24] [--concurrency 6]`.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import secrets
import shutil
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg
from e2b import Sandbox

from bench.cluster import NatsCluster
from bench.events_bench import append_phase
from bench.fleetrig import fleet_rig
from bench.runtime_bench import raw_restore
from bench.scratch import PG
from bench.stats import emit, ratio, summary
from bus import Bus, BusSettings, delete_all, stream_last_seq
from domain import sandbox as sb
from projections import Projector, SandboxProjection, checkpoints, create_engine, migrate
from projections.audit import read_log
from workers.node.image import build_base, kernel_cmdline
from workers.node.runtime import Runtime, init_envd


def creates(
    root: Path, nodes: int, n: int, concurrency: int, sequential: int = 8
) -> dict[str, Any]:
    with fleet_rig(root, apis=1, nodes=nodes) as fleet:
        url, key = fleet.api_url(0), fleet.api_key
        Sandbox.create(timeout=120, api_url=url, sandbox_url=url, api_key=key).kill()  # warm-up
        # latency: one at a time (what one agent sees), beside the raw restore
        alone: list[float] = []
        for _ in range(sequential):
            t0 = time.monotonic()
            sbx = Sandbox.create(timeout=120, api_url=url, sandbox_url=url, api_key=key)
            alone.append(time.monotonic() - t0)
            sbx.kill()
        latencies: list[float] = []
        ids: list[str] = []
        errors: Counter[str] = Counter()
        lock = threading.Lock()
        todo = list(range(n))

        def agent() -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    todo.pop()
                t0 = time.monotonic()
                try:
                    sbx = Sandbox.create(timeout=300, api_url=url, sandbox_url=url, api_key=key)
                except Exception as e:
                    errors[type(e).__name__] += 1
                    continue
                with lock:
                    latencies.append(time.monotonic() - t0)
                    ids.append(sbx.sandbox_id)

        t0 = time.monotonic()
        threads = [threading.Thread(target=agent) for _ in range(concurrency)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.monotonic() - t0
        placed = Counter(_created_on(fleet.nats.url, set(ids)).values())
        for sid in ids:
            Sandbox.kill(sid, api_url=url, sandbox_url=url, api_key=key)
    mean = sum(placed.values()) / max(1, len(placed))
    return {
        "nodes": nodes,
        "creates": n,
        "errors": dict(errors),
        "create_alone": summary(alone),
        "creates_per_s": round(len(ids) / wall, 2),
        "create_latency_under_load": summary(latencies),
        "placement": dict(placed),
        "placement_skew": round(max(placed.values()) / mean, 2) if placed else None,
    }


def _created_on(nats_url: str, ids: set[str]) -> dict[str, str]:
    async def run() -> dict[str, str]:
        settings = BusSettings(nats_url=nats_url)
        bus = await Bus.connect(settings, setup=False, retry=False)
        try:
            log = await read_log(bus.js, settings)
            return {
                r.envelope.aggregate_id: r.event.node_id
                for r in log
                if isinstance(r.event, sb.SandboxCreated) and r.envelope.aggregate_id in ids
            }
        finally:
            await bus.close()

    return asyncio.run(run())


async def raw_primitive(samples: int) -> dict[str, Any]:
    """QEMU restoring the base guest to envd answering, with no control plane."""
    image = build_base(progress=lambda m: None)
    state = Path(tempfile.mkdtemp(prefix="aenv-fleetbench-", dir="/var/tmp"))
    rt = await Runtime.open(
        state, kernel_for_probe=image.kernel, pool_target=2, slot_prefix="aenvq"
    )
    try:
        vm = await rt.boot(
            kernel=image.kernel,
            initrd=image.initrd,
            rootfs=image.rootfs,
            cmdline=kernel_cmdline(image),
            mem_mib=512,
        )
        await rt.wait_envd(vm)
        await init_envd(vm.host, None)
        template = await rt.capture(vm, resume=False)
        envd = [(await raw_restore(rt, template, state / "raw"))[1] for _ in range(samples)]
        return {"accelerator": rt.accel.accel, "restore_to_envd": summary(envd)}
    finally:
        await rt.close()
        shutil.rmtree(state, ignore_errors=True)


async def bus_rate(
    nats_url: str, replicas: int, sandboxes: int, events: int, concurrency: int
) -> dict[str, Any]:
    prefix = f"b{secrets.token_hex(4)}"
    settings = BusSettings(nats_url=nats_url, bus_prefix=prefix, replicas=replicas)
    db = f"aenv_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(f"{PG}/postgres")
    await admin.execute(f'CREATE DATABASE "{db}"')
    url = f"postgresql+asyncpg://{PG.split('://', 1)[1]}/{db}"
    bus = await Bus.connect(settings, name="aenv-fleet-bench")
    engine = create_engine(url)
    try:
        await migrate(url)
        await append_phase(bus, 20, 3, 10, [])  # warm-up
        latencies: list[float] = []
        append_s = await append_phase(bus, sandboxes, events, concurrency, latencies)
        proc = multiprocessing.get_context("spawn").Process(
            target=_projector, args=(nats_url, prefix, url), daemon=True
        )
        proc.start()
        try:
            await checkpoints.wait_for(
                engine, "sandboxes", await stream_last_seq(bus.js, settings), timeout=300
            )
            t = time.perf_counter()
            await append_phase(bus, sandboxes, events, concurrency, [])
            await checkpoints.wait_for(
                engine, "sandboxes", await stream_last_seq(bus.js, settings), timeout=300
            )
            live_s = time.perf_counter() - t
        finally:
            proc.terminate()
            proc.join(10)
        total = sandboxes * events
        return {
            "replicas": replicas,
            "append_events_per_s": round(total / append_s, 1),
            "append_latency": summary(latencies),
            "append_and_project_events_per_s": round(total / live_s, 1),
        }
    finally:
        await engine.dispose()
        await delete_all(bus.js, settings)
        await bus.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        await admin.close()


def _projector(nats_url: str, prefix: str, url: str) -> None:
    async def run() -> None:
        settings = BusSettings(nats_url=nats_url, bus_prefix=prefix)
        bus = await Bus.connect(settings, name="aenv-fleet-bench-projector", setup=False)
        await Projector(create_engine(url), bus.js, settings, SandboxProjection()).run()

    asyncio.run(run())


def main(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="aenv-fleetbench-"))
    try:
        raw = asyncio.run(raw_primitive(args.raw))
        runs = [creates(root / f"n{n}", n, args.creates, args.concurrency) for n in (1, 3)]
        for r in runs:
            r["create_alone_p50_ratio_to_raw_restore"] = ratio(
                r["create_alone"], raw["restore_to_envd"]
            )
        cluster = NatsCluster(root / "bus-cluster")
        cluster.start()
        try:
            cluster.wait_healthy()
            r1 = asyncio.run(
                bus_rate(
                    "nats://127.0.0.1:4222", 1, args.sandboxes, args.events, args.bus_concurrency
                )
            )
            r3 = asyncio.run(
                bus_rate(cluster.url, 3, args.sandboxes, args.events, args.bus_concurrency)
            )
        finally:
            cluster.stop()
        rate = round(r3["append_events_per_s"] / r1["append_events_per_s"], 2)
        bus = {"r1": r1, "r3": r3, "r3_over_r1_append_rate": rate}
        return {"params": vars(args), "raw_primitive": raw, "creates": runs, "bus": bus}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--creates", type=int, default=24)
    p.add_argument("--concurrency", type=int, default=6)
    p.add_argument("--raw", type=int, default=8, help="raw restores measured")
    p.add_argument("--sandboxes", type=int, default=500, help="bus: aggregates")
    p.add_argument("--events", type=int, default=10, help="bus: events per aggregate")
    p.add_argument("--bus-concurrency", type=int, default=64)
    emit("fleet", main(p.parse_args()))


if __name__ == "__main__":
    cli()
