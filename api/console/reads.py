"""What the console's pages read: the read models (`projections.console`, `queries`), the
log (a sandbox's history) and the nodes' heartbeats — each scoped to the caller's team where
it is the team's (sandboxes, templates, builds; the nodes are the fleet's, as
`aenv status` shows them)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from api.context import ApiContext
from api.reads import parse_metadata_filter
from bus.nodes import fleet_view
from domain import sandbox as sb
from domain.sandbox import SandboxStatus
from projections import HistoryLine, history_line, queries
from projections import console as cq

__all__ = [
    "LIVE",
    "ORDER",
    "Filters",
    "History",
    "build",
    "build_log",
    "fleet",
    "sandbox",
    "sandbox_history",
    "sandbox_list",
    "templates",
]

Row = dict[str, Any]

#: Statuses in the order the console lists them: settled ones first, then transitions.
ORDER = (
    "running",
    "paused",
    "creating",
    "resuming",
    "pausing",
    "forking",
    "snapshotting",
    "killing",
    "failed",
    "killed",
)
#: The list's default: every sandbox that is or may still be something (not killed).
LIVE = tuple(s for s in ORDER if s != SandboxStatus.KILLED.value)
PAGE_SIZE = 50


@dataclass(frozen=True)
class Filters:
    """The sandbox list's filters, as the page's form sends them."""

    status: str = "live"
    template: str = ""
    metadata: str = ""
    node: str = ""
    page: int = 1

    def statuses(self) -> tuple[str, ...] | None:
        if self.status == "all":
            return None
        if self.status == "live":
            return LIVE
        return (self.status,) if self.status in ORDER else LIVE


async def fleet(ctx: ApiContext, team_id: str) -> dict[str, Any]:
    """The fleet page: every node's room and pool, the team's sandboxes by status, its
    templates and latest builds."""
    book = await ctx.node_book()
    view = fleet_view(await book.all(), time.time())
    async with ctx.engine.connect() as conn:
        counts = await cq.status_counts(conn, team_id)
        templates = await queries.team_templates(conn, team_id)
        builds = await cq.team_builds(conn, team_id, limit=8)
    return {
        "fleet": view,
        "counts": [(s, counts.get(s, 0)) for s in ORDER],
        "total": sum(counts.values()),
        "templates": len(templates),
        "builds": builds,
        "warm": sum(sum(n["warm"]["ready"].values()) for n in view["nodes"]),
    }


async def sandbox_list(ctx: ApiContext, team_id: str, f: Filters) -> tuple[list[Row], int]:
    async with ctx.engine.connect() as conn:
        return await cq.sandbox_page(
            conn,
            team_id,
            statuses=f.statuses(),
            template=f.template.strip() or None,
            metadata=parse_metadata_filter(f.metadata.strip()),
            node=f.node.strip() or None,
            offset=(max(1, f.page) - 1) * PAGE_SIZE,
            limit=PAGE_SIZE,
        )


async def sandbox(ctx: ApiContext, sandbox_id: str, team_id: str) -> Row | None:
    """The team's sandbox in any state, as the log had it when asked (read fenced)."""
    await ctx.fenced_to(sandbox_id)
    async with ctx.engine.connect() as conn:
        return await cq.sandbox_any_state(conn, sandbox_id, team_id)


@dataclass(frozen=True)
class History:
    """A sandbox's past as the console draws it."""

    #: its events from the log, as `aenv events` shows them
    lines: list[HistoryLine]
    #: (time of each event, the status it left the sandbox in): the domain's own fold
    points: list[tuple[datetime, str]]
    #: its fork family from the read model
    family: list[Row]


async def sandbox_history(ctx: ApiContext, sandbox_id: str, team_id: str) -> History:
    """Call only for a sandbox the team owns (`sandbox` said so)."""
    records = await ctx.bus.sandboxes.read(sandbox_id)
    points: list[tuple[datetime, str]] = []
    state: sb.Sandbox | None = None
    for rec in records:
        state = sb.evolve(state, rec.event)
        if state is not None:
            points.append((rec.envelope.occurred_at, state.status.value))
    async with ctx.engine.connect() as conn:
        family = await cq.family(conn, sandbox_id, team_id)
    return History([history_line(r) for r in records], points, family)


async def templates(
    ctx: ApiContext, team_id: str
) -> tuple[list[tuple[Row | None, list[Row]]], list[Row]]:
    """The team's templates with their builds (newest first), and its latest builds."""
    async with ctx.engine.connect() as conn:
        return (
            await queries.team_templates(conn, team_id),
            await cq.team_builds(conn, team_id, limit=50),
        )


async def build(ctx: ApiContext, build_id: str, team_id: str) -> Row | None:
    async with ctx.engine.connect() as conn:
        return await cq.team_build(conn, build_id, team_id)


async def build_log(ctx: ApiContext, build_id: str, offset: int) -> list[Row]:
    async with ctx.engine.connect() as conn:
        return await queries.build_log_entries(conn, build_id, offset, 500)
