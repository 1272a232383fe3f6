"""Fork of a persistent snapshot into `count` children across the fleet (E2B infra's
`POST /snapshots/{snapshotID}/fork`, RFC #3424: `{"count", "timeout"}` in, one
`{sandbox}` or `{error}` per child out, each child succeeding or failing on its own).

No new aggregate and no new event: each child is a create of the snapshot's template
(its `SandboxRequested` names the snapshot as its template, and its metadata the fork,
`aenv.fork`), sent to placement like any create — admission, the fleet's room and a
node's own pull decide as for one create. What a fork adds are hints (`api/spread.py`):
the node each child is asked of, spread by the room the heartbeats report, and
`copy_on_write`: a node restores every child it takes from the one copy of the capture it
holds (fetched from the repository once, under the node's per-template lock), mapping its
RAM copy-on-write as a running sandbox's fork children do.

A snapshot not yet uploaded is on its node's disk alone: its children all go there. A
node lost mid-way fails the children it claimed (the timer's lost-node rule, as for any
create), and the API withdraws those no node claimed in time; the others start.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from litestar import Request, post

from api import reads, wire
from api.admission import admitted, limits_for
from api.auth import Caller
from api.context import ApiContext, ApiSettings
from api.creates import DEFAULT_TIMEOUT_V2, check_timeout, plan_create, sandbox_body
from api.errors import ADMITTED, ApiError
from api.holders import template_node
from api.leases import check_create as check_lease
from api.outcomes import failure_status
from api.resume import LIVE
from api.room import check_room, disk_need, place_create
from api.spread import check_count, check_fleet_room, check_within_limit, rooms, spread
from domain import sandbox as sb
from projections import ProjectionTimeout, queries

__all__ = ["FORK_KEY", "ROUTES", "checked_fork", "child_creates", "fork_template"]

#: The metadata key naming the fork a child came from (the bulk routes find them by it).
FORK_KEY = "aenv.fork"


async def _snapshot(ctx: ApiContext, caller: Caller, ref: str) -> str:
    """The caller's snapshot `ref` names (its id, or E2B's `team/id`); 404 for none, and
    for another team's (E2B says "not found" too: no probing of other teams' names)."""
    team, _, name = ref.rpartition("/")
    missing = ApiError(404, f"Snapshot '{ref}' not found")
    if team and team != caller.team_id:
        raise missing
    row = await _row(ctx, name)
    if row is None:  # taken a moment ago: its row may not be in the read model yet
        try:
            await ctx.fenced_to_tail()
        except ProjectionTimeout:
            raise missing from None
        row = await _row(ctx, name)
    if row is None or row["team_id"] != caller.team_id:
        raise missing
    return name


async def _row(ctx: ApiContext, name: str) -> dict[str, Any] | None:
    async with ctx.engine.connect() as conn:
        rows = await queries.list_snapshots(conn, None, name=name, limit=1)
    return rows[0] if rows else None


def child_creates(
    tpl: dict[str, Any],
    caller: Caller,
    settings: ApiSettings,
    *,
    fork_id: uuid.UUID,
    count: int,
    timeout: int,
    metadata: dict[str, str],
    forked_from: str | None = None,
) -> list[sb.CreateSandbox]:
    """The creates of a fork's children: a create of the snapshot each (the rules of
    `plan_create`, fresh tokens each), ids and command ids derived from the fork's id
    (an Idempotency-Key's retry names the same children), restored copy-on-write."""
    body = wire.NewSandbox(
        templateID=tpl["template_id"],
        timeout=timeout,
        metadata={**metadata, FORK_KEY: str(fork_id)},
    )
    out = []
    for child in sb.fork_child_ids(fork_id, count):
        cmd = plan_create(
            body,
            tpl,
            caller,
            settings,
            v1=False,
            sandbox_id=child,
            command_id=sb.derived_command_id("snapshot-fork", str(fork_id), child),
        )
        out.append(cmd.model_copy(update={"copy_on_write": True, "forked_from": forked_from}))
    return out


def _placed(
    ctx: ApiContext, tpl: dict[str, Any], creates: list[sb.CreateSandbox]
) -> list[sb.CreateSandbox]:
    """The creates as sent to placement: 503 first when no node could take them all; each
    asked of the node `spread` gives it, with what a node without the capture fetches."""
    first = creates[0]
    disk = disk_need(ctx, tpl)
    check_room(ctx, first.cpu_count, first.memory_mb, disk=disk)  # none beating, cordons, disk
    beats = ctx.nodes.current() if ctx.nodes is not None else None
    room = rooms(beats.values(), first.cpu_count, first.memory_mb) if beats else {}
    check_fleet_room(len(creates), room, first.cpu_count, first.memory_mb)
    asked = spread(len(creates), room)
    return [
        c.model_copy(
            update={
                "prefer_on": (asked[i],) if asked else (),
                "template_bytes": disk.fetched,
            }
        )
        for i, c in enumerate(creates)
    ]


async def _child(
    ctx: ApiContext, caller: Caller, cmd: sb.CreateSandbox, node: str | None, *, named: bool
) -> dict[str, Any]:
    """Send one child's create and wait for it: E2B's `SandboxForkResult`. `named`: its
    id came from an Idempotency-Key, so it may run already (a retry answers it as it is)."""
    domain = ctx.settings.sandbox_domain
    if named:
        existing, _ = await ctx.bus.sandboxes.load(cmd.sandbox_id)
        if existing is not None and existing.status in LIVE:
            return {"sandbox": sandbox_body(existing, domain)}
    try:  # no node took it in time: `no_room`'s 503, as a create's
        event = await place_create(ctx, cmd, node, caller.key_id)
    except ApiError as e:
        return {"error": {"code": e.status, "message": e.message}}
    if isinstance(event, sb.SandboxFailed):
        message = f"child failed to start: {event.reason}"
        return {"error": {"code": failure_status(event), "message": message}}
    return {"sandbox": sandbox_body(cmd, domain)}


async def checked_fork(
    ctx: ApiContext, caller: Caller, *, count: int, timeout: int, metadata: dict[str, str]
) -> None:
    """A fork's request refused before its source is looked at (E2B's body): a count
    outside 1..`AENV_SNAPSHOT_FORK_MAX` or above the caller's running limit, a timeout out
    of bounds 400; a lease (`aenv.lease`) not the team's 400, ended 409."""
    check_count(count, ctx.settings.snapshot_fork_max)
    limits = limits_for(ctx.settings, ctx.admission, caller)
    check_within_limit(count, limits.max_sandboxes, limits.max_from)
    check_timeout(timeout)
    await check_lease(ctx, caller, metadata)


@post("/snapshots/{snapshot_id:str}/fork", status_code=201, responses=ADMITTED)
async def fork_snapshot(
    request: Request[Any, Any, Any],
    snapshot_id: str,
    ctx: ApiContext,
    caller: Caller,
    data: wire.SnapshotForkBody | None = None,
) -> list[dict[str, Any]]:
    """`count` children of a persistent snapshot, spread over the nodes with room; one
    result per child, in order."""
    body = data or wire.SnapshotForkBody()
    count = body.count if body.count is not None else 1
    timeout = body.timeout if body.timeout is not None else DEFAULT_TIMEOUT_V2
    metadata = dict(body.metadata or {})
    await checked_fork(ctx, caller, count=count, timeout=timeout, metadata=metadata)
    name = await _snapshot(ctx, caller, snapshot_id)
    tpl = await reads.template_for(ctx.engine, name)
    if tpl is None:  # deleted meanwhile
        raise ApiError(404, f"Snapshot '{snapshot_id}' not found")
    return await fork_template(
        request, ctx, caller, tpl, count=count, timeout=timeout, metadata=metadata
    )


async def fork_template(
    request: Request[Any, Any, Any],
    ctx: ApiContext,
    caller: Caller,
    tpl: dict[str, Any],
    *,
    count: int,
    timeout: int,
    metadata: dict[str, str],
    scope: str = "snapshot-fork",
    forked_from: str | None = None,
) -> list[dict[str, Any]]:
    """The fork itself, once its source is a durable template row `tpl` (a snapshot's, or
    a paused sandbox's capture: `api/pausefork.py`) and its count, timeout and metadata
    are checked: admission, the spread, one result per child. `scope` keeps the children
    an Idempotency-Key names apart per kind of source; `forked_from`: the paused sandbox
    the children come from (their lineage in the log)."""
    key = request.headers.get("idempotency-key")
    fork_id = sb.derived_command_id(scope, caller.key_id, key) if key else uuid.uuid4()
    creates = child_creates(
        tpl,
        caller,
        ctx.settings,
        fork_id=fork_id,
        count=count,
        timeout=timeout,
        metadata=metadata,
        forked_from=forked_from,
    )
    ids = [c.sandbox_id for c in creates]
    async with admitted(ctx, caller, ids):  # 429 past the team's limits, for all of them
        node = await template_node(ctx, tpl)  # not uploaded yet: its node holds it alone
        if node is None:
            creates = _placed(ctx, tpl, creates)
        else:
            first = creates[0]
            check_room(ctx, first.cpu_count, first.memory_mb, node=node, count=count)
        results = await asyncio.gather(
            *(_child(ctx, caller, c, node, named=key is not None) for c in creates)
        )
    return list(results)


ROUTES = [fork_snapshot]
