"""E2B's sandbox lifecycle routes (e2b-compat §2.3): v1 and v2 create, get, list, kill,
timeout, refreshes, connect.

Lifecycle changes that need a VM are commands to a node (or to placement, for creates);
changes of state alone (the TTL) are decided and appended here, through the same domain
`decide`, since no node has anything to do for them.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime
from typing import Annotated, Any

from litestar import Request, Response, delete, get, post
from litestar.params import Parameter

from api import reads, wire
from api.admission import admitted
from api.auth import Caller
from api.context import ApiContext
from api.creates import (
    DEFAULT_TIMEOUT_V2,
    check_timeout,
    create_ids,
    create_timeout,
    plan_create,
    sandbox_body,
)
from api.errors import ADMITTED, ERRORS, ApiError
from api.guards import node_answers, not_found, visible
from api.hangup import watch_hangup
from api.holders import template_node
from api.ids import is_sandbox_id
from api.images import asked_image, check_template_name, image_template, looks_like_image
from api.leases import check_create as check_lease
from api.missing import template_not_found
from api.mounts import preferred_node, resolve_mounts
from api.outcomes import failure_status, send_and_wait
from api.pausefork import fork_paused, is_paused
from api.resume import LIVE, resume
from api.room import check_room, disk_need, held_nodes, place_create, warm_nodes
from bus.decisions import execute
from bus.envelope import MessageContext
from bus.steps import kill_in_log
from domain import sandbox as sb
from domain import template as tp
from domain import volume as vo
from domain.sandbox import SandboxStatus
from projections import ProjectionTimeout


@post(["/sandboxes", "/v2/sandboxes"], status_code=201, responses=ADMITTED)
async def create_sandbox(
    request: Request[Any, Any, Any], data: wire.NewSandbox, ctx: ApiContext, caller: Caller
) -> Response[dict[str, Any]]:
    v1 = not request.url.path.startswith("/v2/")
    create_timeout(data, v1=v1)  # a bad timeout is a 400 before the template is looked up
    await check_lease(ctx, caller, data.metadata)  # `aenv.lease`: the team's, and live
    tpl = await _template_or_image(ctx, data, caller)
    idempotency_key = request.headers.get("idempotency-key")
    sandbox_id, command_id = create_ids(caller, idempotency_key)
    domain = ctx.settings.sandbox_domain
    if idempotency_key:
        existing, _ = await ctx.bus.sandboxes.load(sandbox_id)
        if existing is not None and existing.status in LIVE:  # a retry of a create that worked
            return Response(sandbox_body(existing, domain), status_code=201)
    cmd = plan_create(
        data, tpl, caller, ctx.settings, v1=v1, sandbox_id=sandbox_id, command_id=command_id
    )
    async with admitted(ctx, caller, (sandbox_id,)):  # 429 past the team's limits
        volumes: list[vo.Volume] = []
        if data.volume_mounts:
            mounts, volumes = await resolve_mounts(ctx, caller, data.volume_mounts, sandbox_id)
            cmd = cmd.model_copy(update={"volume_mounts": mounts})
            sb.decide(None, cmd)  # too many, nested or doubled mounts: 400 before any work
        node, cmd = await _placed(ctx, tpl, cmd, volumes)
        await _started(request, ctx, caller, cmd, node, named=bool(idempotency_key))
    return Response(sandbox_body(cmd, domain), status_code=201)


async def _template_or_image(
    ctx: ApiContext, data: wire.NewSandbox, caller: Caller
) -> dict[str, Any]:
    """The template row a create starts from: of the image its metadata names, else of its
    template — or, if no template has that name and it reads as an image reference, of
    that image (`api/images.py`: imported on first use)."""
    image = asked_image(data.metadata)
    if image is not None:
        return await image_template(ctx, image, caller)
    check_template_name(data.template_id)
    if tp.is_paused_capture_template(data.template_id):  # a fork's, not to start by name
        raise ApiError(404, template_not_found(data.template_id))
    try:
        return await _template(ctx, data.template_id)
    except ApiError as e:
        if e.status != 404 or not looks_like_image(data.template_id):
            raise
    return await image_template(ctx, data.template_id, caller)


async def _template(ctx: ApiContext, template_id: str) -> dict[str, Any]:
    """The row a create of `template_id` starts from; 404 if there is none."""
    # `name:tag` resolves to its build's capture; the tag routes and a finished build
    # forget this entry in this process (other APIs of a fleet may start the build the tag
    # named a moment before: its capture is kept for `capture_grace_s` after release)
    tpl: reads.Row | None = await ctx.cached(
        f"tpl:{template_id}", lambda: reads.template_for(ctx.engine, template_id)
    )
    if tpl is None:
        # a snapshot taken a moment ago (its create answered, the read model not there
        # yet): usable the moment its creation answered, as E2B's
        ctx.forget(f"tpl:{template_id}")
        with contextlib.suppress(ProjectionTimeout):  # a read model far behind: not found
            await ctx.wait_for_templates(await ctx.bus.templates.tail_seq())
        tpl = await reads.template_for(ctx.engine, template_id)
    if tpl is None:
        raise ApiError(404, template_not_found(template_id))
    return tpl


async def _placed(
    ctx: ApiContext, tpl: dict[str, Any], cmd: sb.CreateSandbox, volumes: list[vo.Volume]
) -> tuple[str | None, sb.CreateSandbox]:
    """The node `cmd` goes to (None: placement, after a 503 if no node has room) and the
    create as sent (to placement: with the nodes holding a warm VM or the capture of it)."""
    node = await template_node(ctx, tpl)
    if node is None and volumes:
        node = _room_on(ctx, preferred_node(ctx, volumes), cmd)
    if node is None:  # placement: is there room anywhere? a warm VM somewhere?
        disk = disk_need(ctx, tpl)
        check_room(ctx, cmd.cpu_count, cmd.memory_mb, disk=disk)
        # a warm VM's volume slots hold placeholders: none for a create with mounts
        warm = () if cmd.volume_mounts else warm_nodes(ctx, cmd.template_id)
        hints = {
            "warm_on": warm,
            "held_on": held_nodes(ctx, cmd.template_id, disk),
            "template_bytes": disk.fetched,
        }
        cmd = cmd.model_copy(update=hints)
    return node, cmd


async def _started(
    request: Request[Any, Any, Any],
    ctx: ApiContext,
    caller: Caller,
    cmd: sb.CreateSandbox,
    node: str | None,
    *,
    named: bool,
) -> None:
    """Send `cmd` and wait for it to start, or raise what the client is told instead: 503
    withdrawn unplaced, the failure's status, 499 when the client hung up on a sandbox no
    idempotency key `named` (a retry could not find it: it is killed)."""
    async with watch_hangup(request) as hung_up:
        event = await place_create(ctx, cmd, node, caller.key_id)
        await asyncio.sleep(0)  # a hang-up already read lands before we look
        left = hung_up.done()
    if isinstance(event, sb.SandboxFailed):
        raise ApiError(
            failure_status(event), f"sandbox {cmd.sandbox_id} failed to start: {event.reason}"
        )
    if left and not named and isinstance(event, sb.SandboxCreated):
        # nobody will ever know its id: it must not live out its TTL (api/hangup.py)
        kill = sb.KillSandbox(
            sandbox_id=cmd.sandbox_id,
            command_id=sb.derived_command_id(str(cmd.command_id), "hung-up"),
        )
        await ctx.bus.commands.to_node(
            event.node_id, kill, context=MessageContext(actor=caller.key_id)
        )
        raise ApiError(499, f"the client hung up; sandbox {cmd.sandbox_id} was killed")


def _room_on(ctx: ApiContext, node: str | None, cmd: sb.CreateSandbox) -> str | None:
    """`node` if it has room for the create (then it goes there), else None (placement)."""
    if node is None:
        return None
    try:
        check_room(ctx, cmd.cpu_count, cmd.memory_mb, node=node)
    except ApiError:
        return None
    return node


@get("/sandboxes/{sandbox_id:str}", responses=ERRORS)
async def get_sandbox(sandbox_id: str, ctx: ApiContext, caller: Caller) -> dict[str, Any]:
    if not is_sandbox_id(sandbox_id):
        raise not_found(sandbox_id)
    await ctx.fenced_to(sandbox_id)
    row = await reads.sandbox(ctx.engine, sandbox_id, caller.team_id)
    if row is None:
        raise not_found(sandbox_id)
    body = wire.dump(reads.detail(row))
    if ctx.settings.sandbox_domain:
        body["domain"] = ctx.settings.sandbox_domain
    return body


@delete("/sandboxes/{sandbox_id:str}", status_code=204, responses=ERRORS)
async def kill_sandbox(sandbox_id: str, ctx: ApiContext, caller: Caller) -> None:
    await _kill(ctx, caller, await visible(ctx, caller, sandbox_id))


async def _kill(ctx: ApiContext, caller: Caller, state: sb.Sandbox) -> None:
    """A sandbox on a node that stopped beating is killed in the log (`bus.steps`): no one
    would take the command off that node's queue, and the caller wants it gone whatever is
    left of it. Its VM died with the node process; if the node comes back, its reconcile
    drops what it still holds (a paused capture, the journal entry)."""
    if state.node_id is not None and await ctx.node_gone(state.node_id):
        why = f"node {state.node_id} is gone; killed in the log by the API"
        kill = sb.KillSandbox(sandbox_id=state.sandbox_id)
        await kill_in_log(ctx.bus, kill, state.node_id, why=why, actor=caller.key_id)
        return
    await send_and_wait(
        ctx.bus,
        sb.KillSandbox(sandbox_id=state.sandbox_id),
        node_id=state.node_id,
        until=(sb.SandboxKilled,),
        timeout=ctx.settings.command_timeout_s,
        actor=caller.key_id,
    )


async def _set_timeout(
    ctx: ApiContext, caller: Caller, sandbox_id: str, timeout: int, *, extend_only: bool
) -> sb.Sandbox:
    check_timeout(timeout)
    await visible(ctx, caller, sandbox_id)
    cmd = sb.SetSandboxTimeout(sandbox_id=sandbox_id, timeout_s=timeout, extend_only=extend_only)
    state, _, _ = await execute(ctx.bus.sandboxes, cmd)
    assert state is not None
    return state


@post("/sandboxes/{sandbox_id:str}/timeout", status_code=204, responses=ERRORS)
async def set_timeout(
    sandbox_id: str, data: wire.TimeoutBody, ctx: ApiContext, caller: Caller
) -> None:
    if data.timeout == 0:  # E2B: the timeout is now, its action happens at once
        state = await visible(ctx, caller, sandbox_id)
        if state.lifecycle.on_timeout == "pause":
            await _pause(ctx, caller, state, keep_memory=state.lifecycle.pause_memory)
        else:
            await _kill(ctx, caller, state)
        return
    await _set_timeout(ctx, caller, sandbox_id, data.timeout, extend_only=False)


@post("/sandboxes/{sandbox_id:str}/refreshes", status_code=204, responses=ERRORS)
async def refresh(
    sandbox_id: str, ctx: ApiContext, caller: Caller, data: wire.RefreshBody | None = None
) -> None:
    duration = data.duration if data and data.duration else DEFAULT_TIMEOUT_V2
    await _set_timeout(ctx, caller, sandbox_id, duration, extend_only=True)


@post(
    ["/sandboxes/{sandbox_id:str}/connect", "/v2/sandboxes/{sandbox_id:str}/connect"],
    responses=ADMITTED,
)
async def connect(
    sandbox_id: str, ctx: ApiContext, caller: Caller, data: wire.ConnectBody | None = None
) -> Response[dict[str, Any]]:
    """Running: extend the TTL (never shorten it) and answer 200. Paused: resume, 201."""
    timeout = data.timeout if data and data.timeout is not None else DEFAULT_TIMEOUT_V2
    state = await visible(ctx, caller, sandbox_id)
    if state.status in LIVE:
        state = await _set_timeout(ctx, caller, sandbox_id, timeout, extend_only=True)
        return Response(sandbox_body(state, ctx.settings.sandbox_domain), status_code=200)
    resumed = await _resume(ctx, caller, state, timeout)
    return Response(sandbox_body(resumed, ctx.settings.sandbox_domain), status_code=201)


@post("/sandboxes/{sandbox_id:str}/pause", status_code=204, responses=ERRORS)
async def pause_sandbox(
    sandbox_id: str, ctx: ApiContext, caller: Caller, data: wire.PauseBody | None = None
) -> None:
    """Freeze a running sandbox (`memory: false`: its disk only, the resume boots it
    again); pausing a paused one is a no-op (204)."""
    keep_memory = not (data is not None and data.memory is False)
    await _pause(ctx, caller, await visible(ctx, caller, sandbox_id), keep_memory=keep_memory)


async def _pause(
    ctx: ApiContext, caller: Caller, state: sb.Sandbox, *, keep_memory: bool = True
) -> None:
    sandbox_id = state.sandbox_id
    if state.status in (SandboxStatus.PAUSED, SandboxStatus.PAUSING):
        return
    await node_answers(ctx, state, "pause")
    event, _ = await send_and_wait(
        ctx.bus,
        sb.PauseSandbox(sandbox_id=sandbox_id, keep_memory=keep_memory),
        node_id=state.node_id,
        until=(sb.SandboxPaused,),
        timeout=ctx.settings.command_timeout_s,
        actor=caller.key_id,
    )
    if isinstance(event, sb.SandboxFailed):
        raise ApiError(500, f"sandbox {sandbox_id} failed to pause: {event.reason}")


async def _resume(
    ctx: ApiContext, caller: Caller, state: sb.Sandbox, timeout: int | None
) -> sb.Sandbox:
    if timeout is not None:
        check_timeout(timeout)
    async with admitted(ctx, caller, (state.sandbox_id,), rate=False):  # a running slot
        return await resume(ctx, state, timeout_s=timeout, actor=caller.key_id)


@post("/sandboxes/{sandbox_id:str}/resume", status_code=201, responses=ADMITTED)
async def resume_sandbox(
    sandbox_id: str, ctx: ApiContext, caller: Caller, data: wire.ConnectBody | None = None
) -> dict[str, Any]:
    """The resume route of SDKs before `connect` (409 when it already runs)."""
    state = await visible(ctx, caller, sandbox_id)
    if state.status in LIVE:
        raise ApiError(409, f"sandbox {sandbox_id} is already running")
    resumed = await _resume(ctx, caller, state, data.timeout if data else None)
    return sandbox_body(resumed, ctx.settings.sandbox_domain)


@post("/sandboxes/{sandbox_id:str}/fork", status_code=201, responses=ADMITTED)
async def fork_sandbox(
    request: Request[Any, Any, Any],
    sandbox_id: str,
    ctx: ApiContext,
    caller: Caller,
    data: wire.ForkBody | None = None,
) -> list[dict[str, Any]]:
    """`count` children from one capture of a running sandbox, on its node; of a paused
    one, from its durable capture across the fleet (`api/pausefork.py`). One result per
    child."""
    count = data.count if data and data.count is not None else 1
    state = await visible(ctx, caller, sandbox_id)
    if is_paused(state):
        return await fork_paused(request, ctx, caller, state, data)
    # a child lives as long as its parent was asked to, unless told otherwise (E2B's
    # schema default of 15 s left `aenv fork`'s children paused seconds after their birth)
    timeout = data.timeout if data and data.timeout is not None else state.timeout_s
    cmd = sb.ForkSandbox(sandbox_id=sandbox_id, count=count, timeout_s=timeout)
    sb.decide(state, cmd)  # bad count/timeout or a paused parent: 400/409 before any work
    await node_answers(ctx, state, "fork")
    children = [f"fork-{cmd.command_id}-{i}" for i in range(count)]  # ids not known yet
    async with admitted(ctx, caller, children) as ticket:  # 429 past the team's limits
        check_room(ctx, state.cpu_count, state.memory_mb, node=state.node_id, count=count)
        event, _ = await send_and_wait(
            ctx.bus,
            cmd,
            node_id=state.node_id,
            until=(sb.SandboxForked,),
            timeout=ctx.settings.create_timeout_s,
            actor=caller.key_id,
        )
        if isinstance(event, sb.SandboxFailed):
            raise ApiError(500, f"fork of {sandbox_id} failed: {event.reason}")
        assert isinstance(event, sb.SandboxForked)
        ticket.track(c.sandbox_id for c in event.children if c.error is None)
    out: list[dict[str, Any]] = []
    for child in event.children:
        if child.error is not None:
            out.append({"error": {"code": 500, "message": child.error}})
            continue
        cstate, _ = await ctx.bus.sandboxes.load(child.sandbox_id)
        assert cstate is not None
        out.append({"sandbox": sandbox_body(cstate, ctx.settings.sandbox_domain)})
    return out


def _states(raw: str | None) -> list[str]:
    if not raw:
        return ["running", "paused"]
    states = [s.strip() for s in raw.split(",") if s.strip()]
    bad = [s for s in states if s not in ("running", "paused")]
    if bad:
        raise ApiError(400, f"invalid state filter {bad}: use running and/or paused")
    return states


@get("/v2/sandboxes", responses=ERRORS)
async def list_v2(
    ctx: ApiContext,
    caller: Caller,
    state_filter: Annotated[str | None, Parameter(query="state")] = None,
    metadata: str | None = None,
    template: str | None = None,
    started_after: Annotated[datetime | None, Parameter(query="startedAfter")] = None,
    order: Annotated[str, Parameter(pattern="^(asc|desc)$")] = "desc",
    limit: Annotated[int, Parameter(ge=1, le=100)] = 100,
    next_token: Annotated[str | None, Parameter(query="nextToken")] = None,
    node: str | None = None,  # not in E2B's: only the sandboxes on this node (`aenv ls --node`)
) -> Response[list[dict[str, Any]]]:
    await ctx.fenced_to_tail()
    items, token = await reads.list_sandboxes(
        ctx.engine,
        caller.team_id,
        states=_states(state_filter),
        metadata=reads.parse_metadata_filter(metadata),
        template=template,
        started_after=started_after,
        order=order,
        limit=limit,
        next_token=next_token,
        node=node,
    )
    headers = {"X-Next-Token": token} if token else {}
    return Response([wire.dump(i) for i in items], headers=headers)


@get("/sandboxes", responses=ERRORS)
async def list_v1(
    ctx: ApiContext, caller: Caller, metadata: str | None = None
) -> list[dict[str, Any]]:
    await ctx.fenced_to_tail()
    items, _ = await reads.list_sandboxes(
        ctx.engine,
        caller.team_id,
        states=["running"],
        metadata=reads.parse_metadata_filter(metadata),
        template=None,
        started_after=None,
        order="desc",
        limit=1000,
        next_token=None,
    )
    return [wire.dump(i) for i in items]


ROUTES = [
    create_sandbox,
    get_sandbox,
    kill_sandbox,
    set_timeout,
    refresh,
    connect,
    pause_sandbox,
    resume_sandbox,
    fork_sandbox,
    list_v2,
    list_v1,
]
