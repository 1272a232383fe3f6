"""Fleet-wide leases (`bus.leases`) over real NATS: of many racers exactly one takes a
lease, nobody else while it lasts, and the bucket's TTL frees it without its holder."""

from __future__ import annotations

import asyncio
import contextlib

from nats.js.errors import BucketNotFoundError, NotFoundError

from bus import Bus
from bus.leases import Lease
from tests.support import eventually


async def test_one_of_many_racers_holds_the_lease_until_it_runs_out(bus: Bus) -> None:
    bucket = f"{bus.settings.bus_prefix}_aenv_test_lease"
    try:
        leases = list(
            await asyncio.gather(*(Lease.open(bus.js, bucket, "job", ttl_s=2.0) for _ in range(5)))
        )
        # a node configured with another period uses the bucket (and TTL) the first one made
        leases.append(await Lease.open(bus.js, bucket, "job", ttl_s=3600.0))
        won = await asyncio.gather(*(lease.acquire(f"node-{i}") for i, lease in enumerate(leases)))
        assert sum(won) == 1
        winner = f"node-{won.index(True)}"
        assert await leases[0].holder() == winner
        assert not any([await lease.acquire("late") for lease in leases])

        async def free() -> bool:  # nobody released it: the TTL does
            return await leases[1].holder() is None

        await eventually(free, timeout=10, interval=0.2)
        assert await leases[1].acquire("node-1")
        assert await leases[0].holder() == "node-1"
    finally:
        with contextlib.suppress(NotFoundError, BucketNotFoundError):
            await bus.js.delete_key_value(bucket)
