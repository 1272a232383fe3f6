"""E2B's persistent snapshots (e2b-compat §2.3): take one of a running sandbox (it keeps
running, its capture becomes a template new sandboxes start from), list them, delete one
(`DELETE /templates/{id}`, which every node holding a copy hears)."""

from __future__ import annotations

import contextlib
import re
import secrets
from typing import Annotated, Any

from litestar import delete, get, post
from litestar.params import Parameter

from api import reads, wire
from api.auth import Caller
from api.captures import drop_capture, holders
from api.context import ApiContext
from api.errors import ERRORS, ApiError
from api.guards import node_answers, visible
from api.ids import is_template_ref
from api.outcomes import send_and_wait
from bus.decisions import execute
from domain import build as bd
from domain import sandbox as sb
from domain import tags as tg
from domain import template as tp
from projections import ProjectionTimeout, checkpoints, queries, template_state

__all__ = ["ROUTES", "snapshot_info"]


_SNAPSHOT_NAME = re.compile(r"^[a-z0-9][a-z0-9._:-]{0,127}$")


def snapshot_info(team_id: str, snapshot_id: str) -> dict[str, Any]:
    return {"snapshotID": snapshot_id, "names": [f"{team_id}/{snapshot_id}"]}


@post("/sandboxes/{sandbox_id:str}/snapshots", status_code=201, responses=ERRORS)
async def create_snapshot(
    sandbox_id: str, ctx: ApiContext, caller: Caller, data: wire.SnapshotBody | None = None
) -> dict[str, Any]:
    """A persistent snapshot (memory + disk) that new sandboxes start from; the sandbox
    is captured in place and keeps its id and TTL. Taking a name again replaces it."""
    if data is not None and data.memory is False:
        raise ApiError(400, "filesystem-only snapshots are not supported; omit memory=false")
    name = (data.name if data and data.name else f"snap-{secrets.token_hex(6)}").lower()
    if not _SNAPSHOT_NAME.match(name):
        raise ApiError(400, f"invalid snapshot name {name!r}: use a-z, 0-9, '.', '_', ':', '-'")
    if tp.is_paused_capture_template(name):  # the names of paused captures lent to forks
        raise ApiError(
            400, f"invalid snapshot name {name!r}: {tp.PAUSED_CAPTURE_PREFIX!r} is reserved"
        )
    if tg.split_capture_id(name) is not None:  # `name:<uuid>` names a build (E2B's rule)
        raise ApiError(400, f"invalid snapshot name {name!r}: its tag cannot be a UUID")
    state = await visible(ctx, caller, sandbox_id)
    tpl = await reads.template(ctx.engine, name)
    if tpl is not None and await reads.snapshot_node(ctx.engine, name) is None:
        raise ApiError(409, f"{name!r} is the name of a template, not of a snapshot")
    base, sep, _ = name.partition(":")
    built = await reads.template(ctx.engine, base) if sep else None
    if built is not None and template_state(built).tags:
        # `Sandbox.create(name)` would start this snapshot instead of the tag's build
        raise ApiError(409, f"{base!r} is a template with tags: {name!r} would hide its tag")
    cmd = sb.SnapshotSandbox(sandbox_id=sandbox_id, snapshot_id=name)
    sb.decide(state, cmd)  # a paused or busy sandbox: 409 before any work
    await node_answers(ctx, state, "snapshot")
    event, _ = await send_and_wait(
        ctx.bus,
        cmd,
        node_id=state.node_id,
        until=(sb.SnapshotTaken, sb.SnapshotFailed),
        timeout=ctx.settings.create_timeout_s,
        actor=caller.key_id,
    )
    if isinstance(event, sb.SnapshotFailed | sb.SandboxFailed):
        raise ApiError(500, f"snapshot of {sandbox_id} failed: {event.reason}")
    return snapshot_info(caller.team_id, name)


@get("/snapshots", responses=ERRORS)
async def list_snapshots(
    ctx: ApiContext,
    caller: Caller,
    sandbox_id: Annotated[str | None, Parameter(query="sandboxID")] = None,
    name: str | None = None,
    limit: Annotated[int, Parameter(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    await ctx.fenced_to_tail()
    rows = await reads.snapshots(ctx.engine, caller.team_id, sandbox_id, name, limit)
    return [snapshot_info(caller.team_id, r["snapshot_id"]) for r in rows]


@delete("/templates/{template_id:str}", status_code=204, responses=ERRORS)
async def delete_template(template_id: str, ctx: ApiContext, caller: Caller) -> None:
    """Delete a snapshot template (`Sandbox.delete_snapshot`) or a built one with all its
    tags, or one the listing shows whose builds all failed (`_discard_builds`); 404 when
    there is none. Running sandboxes started from it keep their own copies
    of what they need."""
    if template_id in tp.BUILTIN_TEMPLATES:
        raise ApiError(409, f"the built-in template {template_id!r} cannot be deleted")
    if not is_template_ref(template_id):  # no subject could hold it: nothing to delete
        raise ApiError(404, f"template {template_id!r} not found")
    split = tg.split_capture_id(template_id)
    if split is not None:  # a build's capture: only once no tag of its template names it
        owner, _ = await ctx.bus.templates.load(split[0])
        if owner is not None and template_id in tg.captures(owner.effective_tags()):
            raise ApiError(
                409,
                f"{template_id!r} is a build of template {split[0]!r} that "
                "a tag names: remove its tags instead",
            )
    elif await _discard_builds(ctx, caller, template_id):
        return
    nodes = await holders(ctx, template_id)
    cmd = tp.DeleteTemplate(template_id=template_id)
    state, version, events = await execute(ctx.bus.templates, cmd)
    if events:
        await ctx.wait_for_templates(version.seq)  # read-your-writes for the listings
    ctx.forget(f"tpl:{template_id}")
    ctx.forget(f"tpl-node:{template_id}")
    # the node that took it frees the capture — and so does any node that took it over
    # from the repository; a built template's captures go now too, those released before
    # included (a create racing the delete may fail either way), without the sweeper's grace
    await ctx.bus.commands.to_each_node(nodes, cmd)
    for capture in sorted(state.released) if state is not None else ():
        await drop_capture(ctx, template_id, capture)


async def _discard_builds(ctx: ApiContext, caller: Caller, template_id: str) -> bool:
    """A template no build of it published (they failed, or still wait for their files) has
    no log of its own; the listing shows it from its builds alone, so deleting it discards
    them (`DiscardTemplateBuild`). False: it has a log (the usual delete), or no build
    listed either (the delete's 404). A build still running: 409, nothing discarded."""
    owner, _ = await ctx.bus.templates.load(template_id)
    if owner is not None:
        return False
    async with ctx.engine.connect() as conn:
        listed = await queries.team_templates(conn, caller.team_id)
    builds = next(
        (bs for row, bs in listed if row is None and bs and bs[0]["template_id"] == template_id),
        [],
    )
    if any(b["status"] == bd.BuildStatus.BUILDING.value for b in builds):
        raise ApiError(409, f"template {template_id!r} is being built: delete it once it is done")
    seq = 0
    for b in builds:
        _, version, _ = await execute(
            ctx.bus.builds, bd.DiscardTemplateBuild(build_id=b["build_id"])
        )
        seq = max(seq, version.seq)
    with contextlib.suppress(ProjectionTimeout):  # read-your-writes for the listings
        await checkpoints.wait_for(ctx.engine, "template_builds", seq)
    return bool(builds)


ROUTES = [create_snapshot, list_snapshots, delete_template]
