"""What admission control (`api/admission.py`, issue 32) adds to a create, on this host's
real NATS JetStream and Postgres (a private bus namespace and a scratch database, both
removed at the end):

- census: `projections.census.team_census` — the team's running count and soonest TTL —
  with `--rows` sandboxes in the table, `--team-rows` of them the team's (its running
  limit's check);
- take: `bus.ratebuckets.RateBuckets.take` on one bucket, one caller at a time (a KV get
  and a compare-and-set update: the rate limit's check);
- contended: `--racers` callers taking from one bucket at once (several API replicas
  admitting one team's creates), each through its own NATS connection: takes/s, the
  compare-and-set rounds lost, and that no more was admitted than the bucket allows.

Run: `python -m bench.admission_bench [--n 2000] [--rows 20000] [--team-rows 1000]`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert

from bench.scratch import scratch
from bench.stats import emit, summary
from bus import Bus, BusSettings
from bus.ratebuckets import RateBuckets
from projections import create_engine, migrate
from projections.census import team_census
from projections.tables import sandboxes

STATES = ("running", "running", "running", "paused", "killed", "creating")


def census_row(
    sandbox_id: str, team: str, status: str, end_in_s: float = 100, seq: int = 1
) -> dict[str, Any]:
    """One `sandboxes` read-model row as the projection writes it, for admission's census
    (this bench's table and tests/integration/projections/test_admission_census.py)."""
    now = datetime.now(UTC)
    return {
        "sandbox_id": sandbox_id,
        "status": status,
        "state": status if status in ("running", "paused") else None,
        "template_id": "base",
        "team_id": team,
        "cpu_count": 1,
        "memory_mb": 512,
        "disk_size_mb": 1024,
        "envd_version": "0.2.0",
        "metadata": {},
        "env_vars": {},
        "on_timeout": "pause",
        "auto_resume": False,
        "allow_internet_access": True,
        "network": {},
        "timeout_s": 300,
        "requested_at": now,
        "started_at": now,
        "end_at": now + timedelta(seconds=end_in_s),
        "pending_children": [],
        "updated_at": now,
        "revision": 1,
        "last_seq": seq,
    }


def _row(i: int, team: str) -> dict[str, Any]:
    status = STATES[i % len(STATES)]
    return census_row(f"s{i:08d}", team, status, end_in_s=60 + i % 600, seq=i + 1)


async def census_phase(url: str, rows: int, team_rows: int, n: int) -> dict[str, Any]:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            batch = [_row(i, "bench" if i < team_rows else f"t{i % 97}") for i in range(rows)]
            await conn.execute(insert(sandboxes), batch)
        async with engine.connect() as conn:
            await conn.exec_driver_sql("ANALYZE sandboxes")
        census = await team_census(engine, "bench")  # warm-up, and the figure it reads
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            await team_census(engine, "bench", ("s00000001", "nope"))
            samples.append(time.perf_counter() - t)
        return {"running_counted": census.running, "latency": summary(samples)}
    finally:
        await engine.dispose()


async def take_phase(bus: Bus, n: int) -> dict[str, Any]:
    buckets = RateBuckets(await bus.js.key_value(bus.names.admission_bucket))
    samples = []
    for _ in range(n):  # a rate no caller reaches: every take is a get and an update
        t = time.perf_counter()
        await buckets.take("team.solo", time.time(), rate=1e6, burst=1000)
        samples.append(time.perf_counter() - t)
    return {"latency": summary(samples)}


async def contended_phase(settings: BusSettings, racers: int, seconds: float) -> dict[str, Any]:
    """`racers` connections take from one bucket of 50/s, burst 10, as fast as they can."""
    rate, burst = 50.0, 10
    buses = [await Bus.connect(settings, name=f"racer{i}", setup=False) for i in range(racers)]
    admitted = refused = 0
    try:
        kvs = [RateBuckets(await b.js.key_value(b.names.admission_bucket)) for b in buses]
        stop = time.monotonic() + seconds

        async def race(buckets: RateBuckets) -> None:
            nonlocal admitted, refused
            while time.monotonic() < stop:
                d = await buckets.take("team.hot", time.time(), rate=rate, burst=burst)
                if d.allowed:
                    admitted += 1
                else:
                    refused += 1

        t0 = time.monotonic()
        await asyncio.gather(*(race(k) for k in kvs))
        took = time.monotonic() - t0
        lost = sum(k.lost for k in kvs)
    finally:
        for b in buses:
            await b.close()
    return {
        "racers": racers,
        "seconds": round(took, 2),
        "takes_per_s": round((admitted + refused) / took, 1),
        "admitted": admitted,
        "allowed_at_most": int(burst + rate * took) + 1,
        "refused": refused,
        "cas_rounds_lost": lost,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    async with scratch() as run:
        await migrate(run.url)
        return {
            "census": {
                "rows": args.rows,
                "team_rows": args.team_rows,
                **await census_phase(run.url, args.rows, args.team_rows, args.n),
            },
            "take": await take_phase(run.bus, args.n),
            "contended": await contended_phase(run.settings, args.racers, args.seconds),
        }


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000, help="checks timed per phase")
    p.add_argument("--rows", type=int, default=20000, help="sandboxes in the table")
    p.add_argument("--team-rows", type=int, default=1000, help="of them the team's")
    p.add_argument("--racers", type=int, default=4, help="connections racing for one bucket")
    p.add_argument("--seconds", type=float, default=5.0, help="how long they race")
    emit("admission_bench", asyncio.run(main(p.parse_args())))


if __name__ == "__main__":
    cli()
