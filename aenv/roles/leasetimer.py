"""The api role's lease timer (`workers.timer.leases`), wired to the read model: its
scans and a lease's members are queries of `projections.leasequeries`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from bus import Bus
from bus.bulk import Member
from bus.nodes import NodeBook
from domain import lease as ls
from projections import leasequeries
from workers.timer.leases import LeaseTimer

__all__ = ["lease_timer"]


def lease_timer(
    bus: Bus,
    engine: AsyncEngine,
    nodes: NodeBook,
    on_expired: Callable[[ls.Lease], None] | None = None,
) -> LeaseTimer:
    async def due(now: datetime) -> list[ls.Lease]:
        async with engine.connect() as conn:
            return await leasequeries.due_leases(conn, now)

    async def swept(since: datetime) -> list[ls.Lease]:
        async with engine.connect() as conn:
            return await leasequeries.swept_leases(conn, since)

    async def members(team_id: str, lease_id: str) -> list[Member]:
        async with engine.connect() as conn:
            return await leasequeries.matching_sandboxes(conn, team_id, {ls.LEASE_KEY: lease_id})

    return LeaseTimer(
        bus, due=due, swept=swept, members=members, nodes=nodes, on_expired=on_expired
    )
