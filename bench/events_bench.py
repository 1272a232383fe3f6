"""Event log benchmark: append throughput/latency, projection throughput, full replay rate.

What it measures, on the real NATS JetStream and Postgres of this host, in a private bus
namespace and a scratch database (both removed at the end):

- append: `--sandboxes` aggregates, each driven through `--events` decisions the way the node
  worker does (decide, then `EventStore.append` with optimistic concurrency), `--concurrency`
  aggregates in flight at once. Latency is per append (one publish + ack);
- live: the projector runs in its own process (as deployed) while a second round of appends
  runs; the figure is events/s from the first append until the read model has committed the
  last one (append + projection, end to end, read-your-writes polled as the API would);
- projection: the sandboxes projection refolds the whole stream from 0 into empty tables
  (batched transactions), i.e. `aenv projections rebuild` without the swap;
- replay: the full stream read back through an ordered consumer, decoded and folded into
  states in memory (what a cold worker or an auditor's tool does).

Run: `python -m bench.events_bench [--sandboxes 1000] [--events 10] [--concurrency 64]`.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.scratch import NATS_URL, scratch
from bench.stats import emit, summary
from bus import Bus, BusSettings, EventFeed, MessageContext, stream_last_seq
from domain import sandbox as sb
from projections import (
    Projector,
    SandboxProjection,
    checkpoints,
    create_engine,
    migrate,
    rebuild,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def commands(sid: str, n: int) -> list[sb.AnySandboxCommand]:
    """n commands for one sandbox: create, complete, then TTL changes (one event each)."""
    out: list[sb.AnySandboxCommand] = [
        sb.CreateSandbox(sandbox_id=sid, template_id="base", at=T0, metadata={"b": "1"}),
        sb.CompleteCreate(sandbox_id=sid, node_id="bench", at=T0),
    ]
    out += [
        sb.SetSandboxTimeout(sandbox_id=sid, timeout_s=60 + i, at=T0 + timedelta(seconds=i))
        for i in range(n - 2)
    ]
    return out


async def drive(bus: Bus, sid: str, n: int, latencies: list[float]) -> None:
    state: sb.State = None
    version = bus.sandboxes.NEW
    for cmd in commands(sid, n):
        events = sb.decide(state, cmd)
        t = time.perf_counter()
        version = await bus.sandboxes.append(
            sid, version, events, context=MessageContext(causation_id=cmd.command_id)
        )
        latencies.append(time.perf_counter() - t)
        state = sb.fold(events, state)


async def append_phase(
    bus: Bus, sandboxes: int, events: int, concurrency: int, latencies: list[float]
) -> float:
    ids = [sb.new_sandbox_id() for _ in range(sandboxes)]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for sid in ids:
        queue.put_nowait(sid)

    async def worker() -> None:
        while not queue.empty():
            await drive(bus, queue.get_nowait(), events, latencies)

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t


async def replay(bus: Bus) -> tuple[int, float]:
    last = await stream_last_seq(bus.js, bus.settings)
    states: dict[str, sb.State] = {}
    n = 0
    t = time.perf_counter()
    async with EventFeed(bus.js, bus.settings, bus.names.all_events, max_batch=1000) as feed:
        seen = 0
        while seen < last:
            for rec in await feed.next_batch(5.0):
                agg = rec.envelope.aggregate_id
                states[agg] = sb.evolve(states.get(agg), rec.event)
                seen, n = rec.seq, n + 1
    return n, time.perf_counter() - t


async def main(args: argparse.Namespace) -> dict[str, Any]:
    async with scratch() as run:
        bus, settings, url = run.bus, run.settings, run.url
        prefix = settings.bus_prefix
        engine = create_engine(url)
        try:
            await migrate(url)
            total = args.sandboxes * args.events
            # warm-up (connections, JIT-less Python caches), not measured
            await append_phase(bus, 20, 3, 10, [])

            latencies: list[float] = []
            append_s = await append_phase(
                bus, args.sandboxes, args.events, args.concurrency, latencies
            )

            # Live: the projector in its own process (as deployed), the read model polled the
            # way another process (the API) waits for its writes.
            proc = multiprocessing.get_context("spawn").Process(
                target=_projector_process, args=(prefix, url), daemon=True
            )
            proc.start()
            try:
                await checkpoints.wait_for(
                    engine, "sandboxes", await stream_last_seq(bus.js, settings), timeout=300
                )
                t = time.perf_counter()
                await append_phase(bus, args.sandboxes, args.events, args.concurrency, [])
                await checkpoints.wait_for(
                    engine, "sandboxes", await stream_last_seq(bus.js, settings), timeout=300
                )
                live_s = time.perf_counter() - t
            finally:
                proc.terminate()
                proc.join(10)

            report = await rebuild(engine, bus.js, settings, SandboxProjection(), swap=False)
            stream_events = await stream_last_seq(bus.js, settings)
            replayed, replay_s = await replay(bus)
            return {
                "params": vars(args),
                "events": total,
                "append": {
                    "events_per_s": round(total / append_s, 1),
                    "seconds": round(append_s, 3),
                    "latency": summary(latencies),
                },
                "append_and_project_live": {
                    "events_per_s": round(total / live_s, 1),
                    "seconds": round(live_s, 3),
                },
                "projection_rebuild": {
                    "events_per_s": round(stream_events / report.seconds, 1),
                    "seconds": round(report.seconds, 3),
                    "rows": report.rows,
                    "identical_to_live": report.identical,
                },
                "replay_in_memory": {
                    "events_per_s": round(replayed / replay_s, 1),
                    "events": replayed,
                    "seconds": round(replay_s, 3),
                },
                "target_events_per_s": 5000,
            }
        finally:
            await engine.dispose()


def _projector_process(prefix: str, url: str) -> None:
    async def run() -> None:
        settings = BusSettings(nats_url=NATS_URL, bus_prefix=prefix)
        bus = await Bus.connect(settings, name="aenv-bench-projector", setup=False)
        engine = create_engine(url)
        await Projector(engine, bus.js, settings, SandboxProjection()).run()

    asyncio.run(run())


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=1000)
    parser.add_argument("--events", type=int, default=10, help="events per sandbox (>= 2)")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    emit("events", asyncio.run(main(args)))


if __name__ == "__main__":
    cli()
