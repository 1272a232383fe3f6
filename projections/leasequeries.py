"""Read-model queries of leases and of bulk actions by metadata (issue 32): the sandboxes
whose metadata holds a filter (a bulk kill's, a lease's members), the leases whose
deadline passed and those ended recently (the lease timer's scans), a team's leases."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from bus.bulk import Member
from domain import lease as ls
from domain import sandbox as sb
from projections.folding import Row
from projections.leases import lease_from_row
from projections.tables import leases, sandboxes

__all__ = [
    "due_leases",
    "lease_member_counts",
    "matching_sandboxes",
    "swept_leases",
    "team_lease",
    "team_leases",
]

#: sandboxes a bulk action or a lease may still act on
_NOT_ENDED = [
    s.value for s in sb.SandboxStatus if s not in (sb.SandboxStatus.KILLED, sb.SandboxStatus.FAILED)
]


async def matching_sandboxes(
    conn: AsyncConnection, team_id: str, metadata: Mapping[str, str] | None
) -> list[Member]:
    """The team's sandboxes not killed or failed whose metadata holds every pair of
    `metadata` (E2B's list filter: JSONB containment, exact values); None: all of them."""
    c = sandboxes.c
    q = select(c.sandbox_id, c.node_id, c.status, c.revision).where(
        c.team_id == team_id, c.status.in_(_NOT_ENDED)
    )
    if metadata is not None:
        q = q.where(c.metadata.contains(dict(metadata)))
    rows = (await conn.execute(q.order_by(c.sandbox_id))).all()
    return [Member(r.sandbox_id, r.node_id, sb.SandboxStatus(r.status), r.revision) for r in rows]


async def due_leases(conn: AsyncConnection, now: datetime) -> list[ls.Lease]:
    """Active leases whose deadline is past (the timer decides their expiry on the log)."""
    c = leases.c
    q = select(leases).where(c.status == ls.LeaseStatus.ACTIVE.value, c.expires_at <= now)
    return [lease_from_row(dict(r)) for r in (await conn.execute(q)).mappings()]


async def swept_leases(conn: AsyncConnection, since: datetime) -> list[ls.Lease]:
    """Leases that expired or were ended at or after `since`: their sandboxes are swept."""
    c = leases.c
    q = select(leases).where(c.status != ls.LeaseStatus.ACTIVE.value, c.ended_at >= since)
    return [lease_from_row(dict(r)) for r in (await conn.execute(q)).mappings()]


async def team_leases(conn: AsyncConnection, team_id: str, *, limit: int = 1000) -> list[Row]:
    c = leases.c
    q = select(leases).where(c.team_id == team_id).order_by(c.opened_at.desc()).limit(limit)
    return [dict(r) for r in (await conn.execute(q)).mappings()]


async def team_lease(conn: AsyncConnection, team_id: str, lease_id: str) -> Row | None:
    c = leases.c
    q = select(leases).where(c.team_id == team_id, c.lease_id == lease_id)
    r = (await conn.execute(q)).mappings().first()
    return dict(r) if r is not None else None


async def lease_member_counts(
    conn: AsyncConnection, team_id: str, lease_ids: Sequence[str]
) -> dict[str, int]:
    """How many sandboxes not killed or failed each lease holds."""
    if not lease_ids:
        return {}
    c = sandboxes.c
    key = c.metadata[ls.LEASE_KEY].astext
    q = (
        select(key, func.count())
        .where(c.team_id == team_id, c.status.in_(_NOT_ENDED), key.in_(list(lease_ids)))
        .group_by(key)
    )
    return {str(k): int(n) for k, n in (await conn.execute(q)).all()}
