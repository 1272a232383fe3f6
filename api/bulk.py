"""Bulk actions by metadata (not in E2B's API; issue 32): `POST /sandboxes/bulk/kill`,
`/bulk/pause` and `/bulk/list` act on every sandbox of the caller's team whose metadata
matches a filter, in one request, server-side.

The filter is E2B's list filter (`GET /v2/sandboxes?metadata=`): every key=value pair of
`metadata` must be in the sandbox's metadata, values compared exactly (JSONB containment,
the same query). An empty filter matches every sandbox of the team, so it is refused
(400) unless the body says `"all": true` — and `all` with a filter is refused too, as
ambiguous. Another team's sandboxes are never matched: the query is the caller's team's.

**Point in the log.** The request waits until the read model has folded every sandbox
event the log held when it came (`fenced_to_tail`), then takes the matching sandboxes
from it: every sandbox created before the request is in the set, one whose create is
appended later is not. Each sandbox of the set gets its own whole kill (or pause) — a
create racing the request is either in the set and killed like the others, or not in it
and untouched, never half-done — and the answer names the ids it acted on (`sandboxIDs`)
and those it could not (`failed`, with why). Kills and pauses run at once, a few at a
time, each waiting for its outcome, so a listing after the answer no longer shows them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from litestar import post
from pydantic import BaseModel, ConfigDict, Field

from api.auth import Caller
from api.context import ApiContext
from api.errors import ERRORS, ApiError
from api.outcomes import send_and_wait
from bus.bulk import Action, Member, acted_on, end_command
from bus.steps import kill_in_log
from domain import DomainError
from domain import sandbox as sb
from projections import leasequeries

__all__ = ["ROUTES", "BulkBody", "BulkResult", "bulk_filter", "run"]

#: kills or pauses in flight at once per request (each waits for its node's answer)
PARALLEL = 16


class BulkBody(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    metadata: dict[str, str] = Field(default_factory=dict)
    #: act on every sandbox of the team (an empty filter alone is refused)
    all: bool = False


def bulk_filter(body: BulkBody) -> dict[str, str] | None:
    """The metadata filter of a bulk request; None: all the team's sandboxes."""
    if body.all and body.metadata:
        raise ApiError(400, "give either a metadata filter or all: true, not both")
    if body.all:
        return None
    if not body.metadata:
        raise ApiError(
            400,
            "an empty metadata filter matches every sandbox of the team: "
            'send {"all": true} to mean that',
        )
    return dict(body.metadata)


@dataclass
class BulkResult:
    action: str
    #: sandboxes matching at the request's point in the log
    matched: list[str]
    done: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)

    def wire(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "count": len(self.done),
            "sandboxIDs": sorted(self.done),
            "matched": len(self.matched),
            "failed": [{"sandboxID": s, "message": m} for s, m in sorted(self.failed)],
        }


async def matching(
    ctx: ApiContext, caller: Caller, metadata: dict[str, str] | None
) -> list[Member]:
    await ctx.fenced_to_tail()
    async with ctx.engine.connect() as conn:
        return await leasequeries.matching_sandboxes(conn, caller.team_id, metadata)


async def _end(ctx: ApiContext, caller: Caller, member: Member, action: Action) -> None:
    cmd = end_command(member, action, tag="bulk")
    node = member.node_id
    if isinstance(cmd, sb.KillSandbox) and node is not None and await ctx.node_gone(node):
        why = f"node {node} is gone; killed in the log by a bulk kill"
        await kill_in_log(ctx.bus, cmd, node, why=why, actor=caller.key_id, moot_ok=True)
        return
    until = (sb.SandboxKilled,) if action == "kill" else (sb.SandboxPaused,)
    event, _ = await send_and_wait(
        ctx.bus,
        cmd,
        node_id=node,
        until=until,
        timeout=ctx.settings.command_timeout_s,
        actor=caller.key_id,
    )
    if isinstance(event, sb.SandboxFailed):
        raise ApiError(500, f"failed: {event.reason}")


async def run(
    ctx: ApiContext, caller: Caller, metadata: dict[str, str] | None, action: Action
) -> BulkResult:
    """Kill or pause every sandbox of the caller's team matching `metadata` (None: all)."""
    members = await matching(ctx, caller, metadata)
    result = BulkResult(action, [m.sandbox_id for m in members])
    gate = asyncio.Semaphore(PARALLEL)

    async def one(member: Member) -> None:
        async with gate:
            try:
                await _end(ctx, caller, member, action)
            except ApiError as e:
                if action == "kill" and e.status == 404:  # killed meanwhile: gone as asked
                    return
                result.failed.append((member.sandbox_id, e.message))
                return
            except DomainError as e:
                result.failed.append((member.sandbox_id, e.message))
                return
            result.done.append(member.sandbox_id)

    await asyncio.gather(*(one(m) for m in acted_on(members, action)))
    return result


@post("/sandboxes/bulk/kill", status_code=200, responses=ERRORS)
async def bulk_kill(ctx: ApiContext, caller: Caller, data: BulkBody) -> dict[str, Any]:
    """Kill every sandbox of the team whose metadata matches (`all`: every one)."""
    return (await run(ctx, caller, bulk_filter(data), "kill")).wire()


@post("/sandboxes/bulk/pause", status_code=200, responses=ERRORS)
async def bulk_pause(ctx: ApiContext, caller: Caller, data: BulkBody) -> dict[str, Any]:
    """Pause every running sandbox of the team whose metadata matches (memory kept)."""
    return (await run(ctx, caller, bulk_filter(data), "pause")).wire()


@post("/sandboxes/bulk/list", status_code=200, responses=ERRORS)
async def bulk_list(ctx: ApiContext, caller: Caller, data: BulkBody) -> dict[str, Any]:
    """The ids and states of every sandbox of the team whose metadata matches, unpaged."""
    members = await matching(ctx, caller, bulk_filter(data))
    items = [{"sandboxID": m.sandbox_id, "status": m.status.value} for m in members]
    return {"count": len(items), "sandboxes": items}


ROUTES = [bulk_kill, bulk_pause, bulk_list]
