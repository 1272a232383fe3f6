"""The web console's reads over the read models (`api/console`): a team's sandboxes in every
state (killed and failed ones too — the console is where a user finds out which one failed
and why), counted by state, filtered and paged; one sandbox whatever its state; the fork
family it belongs to; a team's builds.

E2B's routes (`queries`) show only running and paused sandboxes; these show the rest, and
stay apart so that E2B's answers never change with the console.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, func, or_, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from projections.tables import builds, sandboxes

__all__ = [
    "FAMILY_LIMIT",
    "family",
    "sandbox_any_state",
    "sandbox_page",
    "status_counts",
    "team_build",
    "team_builds",
]

Row = dict[str, Any]

#: A fork family drawn at most this big (a tree of 16-way forks 3 deep is 4,369 sandboxes:
#: nobody reads that as a picture, and the page must stay fast).
FAMILY_LIMIT = 300
#: Fork depth followed at most, up and down: a cycle the log should never hold ends here.
_MAX_DEPTH = 64

#: Columns of a listing row: what the table shows, never tokens or env vars.
_LISTED = (
    "sandbox_id",
    "status",
    "state",
    "template_id",
    "alias",
    "node_id",
    "forked_from",
    "cpu_count",
    "memory_mb",
    "metadata",
    "requested_at",
    "started_at",
    "end_at",
    "remaining_s",
    "failure_reason",
    "updated_at",
)


async def status_counts(conn: AsyncConnection, team_id: str) -> dict[str, int]:
    """How many of the team's sandboxes are in each status (creating … killed, failed)."""
    c = sandboxes.c
    q = select(c.status, func.count()).where(c.team_id == team_id).group_by(c.status)
    return {status: int(n) for status, n in (await conn.execute(q)).all()}


async def sandbox_page(
    conn: AsyncConnection,
    team_id: str,
    *,
    statuses: Sequence[str] | None = None,
    template: str | None = None,
    metadata: dict[str, str] | None = None,
    node: str | None = None,
    offset: int = 0,
    limit: int = 50,
) -> tuple[list[Row], int]:
    """One page of the team's sandboxes, newest request first, and how many match in all.
    `statuses` None: every status."""
    c = sandboxes.c
    where = [c.team_id == team_id]
    if statuses is not None:
        where.append(c.status.in_(list(statuses)))
    if template:
        where.append(or_(c.template_id == template, c.alias == template))
    if metadata:
        where.append(c.metadata.contains(metadata))  # JSONB @>, the GIN index
    if node:
        where.append(c.node_id == node)
    total = int(await conn.scalar(select(func.count()).select_from(sandboxes).where(*where)) or 0)
    q: Select[Any] = (
        select(*(c[name] for name in _LISTED))
        .where(*where)
        .order_by(c.requested_at.desc(), c.sandbox_id.desc())
        .offset(max(0, offset))
        .limit(max(1, limit))
    )
    return [dict(r) for r in (await conn.execute(q)).mappings()], total


async def sandbox_any_state(conn: AsyncConnection, sandbox_id: str, team_id: str) -> Row | None:
    """One of the team's sandboxes in whatever state (a killed one too), else None."""
    c = sandboxes.c
    q = select(sandboxes).where(c.sandbox_id == sandbox_id, c.team_id == team_id)
    row = (await conn.execute(q)).mappings().first()
    return dict(row) if row else None


_FAMILY = text(
    """
    WITH RECURSIVE up(sandbox_id, forked_from, depth) AS (
        SELECT sandbox_id, forked_from, 0 FROM sandboxes
        WHERE sandbox_id = :sid AND team_id = :team
      UNION ALL
        SELECT s.sandbox_id, s.forked_from, up.depth + 1
        FROM sandboxes s JOIN up ON s.sandbox_id = up.forked_from
        WHERE s.team_id = :team AND up.depth < :depth
    ),
    root AS (SELECT sandbox_id FROM up ORDER BY depth DESC LIMIT 1),
    down(sandbox_id, depth) AS (
        SELECT sandbox_id, 0 FROM root
      UNION ALL
        SELECT s.sandbox_id, down.depth + 1
        FROM sandboxes s JOIN down ON s.forked_from = down.sandbox_id
        WHERE s.team_id = :team AND down.depth < :depth
    )
    SELECT s.sandbox_id, s.status, s.forked_from, s.requested_at, s.template_id,
           s.failure_reason
    FROM sandboxes s JOIN (SELECT DISTINCT sandbox_id FROM down) d USING (sandbox_id)
    ORDER BY s.requested_at, s.sandbox_id
    LIMIT :limit
    """
)


async def family(
    conn: AsyncConnection, sandbox_id: str, team_id: str, limit: int = FAMILY_LIMIT
) -> list[Row]:
    """The fork family of a sandbox: its first ancestor the team owns and every descendant
    of that one (`forked_from` links, which the `SandboxForked` of each parent set), in
    request order, at most `limit` rows (the caller says the tree was cut). Empty when
    the team has no such sandbox."""
    params = {"sid": sandbox_id, "team": team_id, "depth": _MAX_DEPTH, "limit": limit}
    return [dict(r) for r in (await conn.execute(_FAMILY, params)).mappings()]


async def team_builds(conn: AsyncConnection, team_id: str, limit: int = 20) -> list[Row]:
    """The team's latest template builds, newest first."""
    c = builds.c
    q = (
        select(
            c.build_id,
            c.template_id,
            c.alias,
            c.status,
            c.reason,
            c.failed_step,
            c.log_count,
            c.requested_at,
            c.started_at,
            c.finished_at,
        )
        .where(c.team_id == team_id)
        .order_by(c.requested_at.desc())
        .limit(limit)
    )
    return [dict(r) for r in (await conn.execute(q)).mappings()]


async def team_build(conn: AsyncConnection, build_id: str, team_id: str) -> Row | None:
    """One of the team's builds, else None."""
    q = select(builds).where(builds.c.build_id == build_id, builds.c.team_id == team_id)
    row = (await conn.execute(q)).mappings().first()
    return dict(row) if row else None
