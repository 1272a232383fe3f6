"""Fleet-wide token buckets (`bus.ratebuckets`, issue 32) over real NATS: API replicas
racing for one team's bucket, each through its own connection, admit no more than the
bucket allows between them; a bucket refills; an entry that is not ours reads as full."""

from __future__ import annotations

import asyncio
import time

from bus import Bus
from bus.ratebuckets import RateBuckets

RATE, BURST = 20.0, 5


async def test_replicas_racing_for_one_bucket_admit_no_more_than_it_holds(bus: Bus) -> None:
    replicas = [await Bus.connect(bus.settings, name=f"api{i}", setup=False) for i in range(4)]
    try:
        takers = [RateBuckets(await r.js.key_value(r.names.admission_bucket)) for r in replicas]
        admitted = 0
        t0 = time.time()
        stop = time.monotonic() + 2.0

        async def race(b: RateBuckets) -> None:
            nonlocal admitted
            while time.monotonic() < stop:
                d = await b.take("team.hot", time.time(), rate=RATE, burst=BURST)
                admitted += d.allowed
                if not d.allowed:
                    assert d.retry_after_s > 0

        await asyncio.gather(*(race(b) for b in takers))
        elapsed = time.time() - t0
        allowed = BURST + RATE * elapsed
        assert admitted <= allowed + 1, (admitted, allowed)
        assert admitted >= BURST + RATE * 1.5, (admitted, allowed)  # and it does let them in
    finally:
        for r in replicas:
            await r.close()


async def test_a_bucket_refills_and_a_foreign_value_reads_as_full(bus: Bus) -> None:
    buckets = RateBuckets(await bus.js.key_value(bus.names.admission_bucket))
    now = time.time()
    assert [(await buckets.take("team.a", now, rate=2, burst=2)).allowed for _ in range(3)] == [
        True,
        True,
        False,
    ]
    assert (await buckets.take("team.b", now, rate=2, burst=2)).allowed  # another bucket
    assert (await buckets.take("team.a", now + 0.5, rate=2, burst=2)).allowed
    await buckets.kv.put(RateBuckets.key("team.a"), b"not a number")
    assert (await buckets.take("team.a", now + 0.5, rate=2, burst=2)).allowed
    # a team id no KV key could hold is still a bucket of its own
    assert (await buckets.take("team.with space/and*stars>", now, rate=1, burst=1)).allowed


async def test_many_takes_of_one_process_never_starve_each_other(bus: Bus) -> None:
    """16 creates in flight on one API, at a rate nobody reaches: none refused (they lost
    ten compare-and-set rounds in a row to each other and were refused as contended)."""
    buckets = RateBuckets(await bus.js.key_value(bus.names.admission_bucket))

    async def take() -> bool:
        return (await buckets.take("team.busy", rate=1e6, burst=1000)).allowed

    for _ in range(5):
        assert all(await asyncio.gather(*(take() for _ in range(16))))
    assert buckets.lost == 0
