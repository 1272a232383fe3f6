"""How many sandboxes a team has running, from the read model: what admission control
(`api/admission.py`) compares with the team's limit on every create, resume and fork.

One aggregate over the team's rows that hold a VM (the partial index
`ix_sandboxes_team_holding_vm`: killed rows, never deleted, are not read) and, when the API
has admitted sandboxes the read model may not show yet, one lookup of those by id."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.sandbox import SandboxStatus
from projections.tables import sandboxes

__all__ = ["HOLDING_A_VM", "HOLDS_A_VM", "TeamCensus", "team_census"]

#: The states in which a sandbox holds (or is about to hold) a VM on a node: what a
#: team's running limit counts. Paused sandboxes hold none; a killing one is going.
HOLDS_A_VM = tuple(
    s.value
    for s in (
        SandboxStatus.CREATING,
        SandboxStatus.RUNNING,
        SandboxStatus.PAUSING,
        SandboxStatus.RESUMING,
        SandboxStatus.SNAPSHOTTING,
        SandboxStatus.FORKING,
    )
)

#: The predicate of the partial index, as constants: a bound list (`IN ($1, …)`) would not
#: let a generic plan prove it and use the index.
HOLDING_A_VM = text("status IN (" + ", ".join(f"'{s}'" for s in HOLDS_A_VM) + ")")


@dataclass(frozen=True)
class TeamCensus:
    #: The team's sandboxes holding a VM, as the read model has them now.
    running: int
    #: When the first of its running sandboxes reaches its TTL (None: none running).
    soonest_end: datetime | None
    #: Of the ids asked about, those the read model has in any state, by status.
    seen: dict[str, str]


async def team_census(engine: AsyncEngine, team_id: str, ids: Collection[str] = ()) -> TeamCensus:
    t = sandboxes
    # the partial index `ix_sandboxes_team_holding_vm`: the team's live rows only
    q = select(
        func.count(),
        func.min(t.c.end_at).filter(t.c.status == SandboxStatus.RUNNING.value),
    ).where(t.c.team_id == team_id, HOLDING_A_VM)
    # one snapshot for both: a row the projection commits between them would be seen by
    # the lookup but not counted, and the caller would drop it from what it holds (found
    # under load: a key at 1 of 1 admitted a second create)
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="REPEATABLE READ")
        async with conn.begin():
            running, soonest = (await conn.execute(q)).one()
            seen: dict[str, str] = {}
            if ids:
                rows = await conn.execute(
                    select(t.c.sandbox_id, t.c.status).where(t.c.sandbox_id.in_(list(ids)))
                )
                seen = {r.sandbox_id: r.status for r in rows}
    return TeamCensus(int(running or 0), soonest, seen)
