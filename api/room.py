"""A create no node can take is answered within a bounded time: 503 with E2B's body and a
Retry-After, not a wait on the placement queue until the create's timeout.

Placement stays pull-based (a node pulls a create only while it has room: design §9), and
the API reads the same facts first: the room every node reports in its heartbeat
(`bus.nodes`), so a fleet known to be full says so in milliseconds (`check_room`). The
heartbeats are a few seconds old, so a burst can still queue a create that no node has
room for: no node pulls it. If none has taken it (appended its `SandboxRequested`) within
`AENV_PLACEMENT_TIMEOUT_S`, the API withdraws it (`withdraw`; its log part is
`bus.steps.withdraw_create`): it records the request and its failure itself, both guarded
by the aggregate's expected sequence, so either a node's claim came first (then its
outcome answers, as usual) or the withdrawal did (then a node that pulls the create later
finds it failed and decides nothing). A create a pipeline publishes straight to NATS has
no such deadline: it waits in the queue for room.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from api.context import ApiContext
from api.errors import ApiError
from api.outcomes import send_and_wait
from bus.diskroom import DiskNeed, short_of_disk, template_bytes
from bus.nodes import Heartbeat, has_room, is_gone, takes_new
from bus.steps import withdraw_create
from domain import Event
from domain import sandbox as sb

__all__ = [
    "RETRY_AFTER_S",
    "check_room",
    "disk_need",
    "held_nodes",
    "no_room",
    "warm_nodes",
    "withdraw",
]

#: What a refused client is told to wait (the SDK honours it, up to 3 retries).
RETRY_AFTER_S = 5
_RETRY = {"Retry-After": str(RETRY_AFTER_S)}


def check_room(
    ctx: ApiContext,
    vcpus: int,
    mem_mib: int,
    *,
    node: str | None = None,
    count: int = 1,
    disk: DiskNeed | None = None,
) -> None:
    """Raise 503 when no node beating now has room for `count` sandboxes of this size (on
    `node` only: a fork's children start beside their parent), or — `disk` given — none
    that has it has the disk room for the template too. Quiet when the API has not heard
    the nodes yet (its mirror of the bucket is still filling)."""
    beats = ctx.nodes.current() if ctx.nodes is not None else None
    if beats is None:
        return
    now = time.time()
    beating = [b for b in beats.values() if not is_gone(b, now) and node in (None, b.node_id)]
    live = [b for b in beating if takes_new(b, now)]  # a cordoned node takes none
    vcpus, mem_mib = vcpus * count, mem_mib * count
    headers = _RETRY
    if not live and beating:
        which = f"node {node} is" if node else "every running node is"
        raise ApiError(503, f"{which} cordoned: nothing can take the sandbox", headers=headers)
    if not live:
        raise ApiError(503, "no node is running: nothing can take the sandbox", headers=headers)
    roomy = [b for b in live if has_room(b, vcpus, mem_mib, count)]
    if roomy and (disk is None or not short_of_disk(roomy, disk)):
        return
    if roomy and disk is not None:
        raise ApiError(503, disk.refusal(roomy), headers=headers)
    most = max(live, key=lambda b: (b.free_mem_mib or 0, b.free_vcpus or 0))
    raise ApiError(
        503,
        f"no node has room for {count} sandbox{'es' if count != 1 else ''} of "
        f"{vcpus // count} vCPU / {mem_mib // count} MiB: {len(live)} "
        f"node{'s' if len(live) != 1 else ''} running, the emptiest ({most.node_id}) has "
        f"{most.free_vcpus} vCPU / {most.free_mem_mib} MiB / {most.free} sandboxes left",
        headers=headers,
    )


def warm_nodes(ctx: ApiContext, template_id: str) -> tuple[str, ...]:
    """Nodes beating now, not cordoned, whose heartbeat says they hold a warm VM of
    `template_id` (the create's `warm_on` hint: they take it before a node that would
    restore it cold)."""
    return _beating(ctx, lambda b: b.warm.get(template_id, 0) > 0)


def held_nodes(ctx: ApiContext, template_id: str, disk: DiskNeed | None = None) -> tuple[str, ...]:
    """Nodes beating now whose heartbeat says `template_id`'s capture is on their disk
    (the create's `held_on` hint: they take it before a node that would fetch it) — and,
    `disk` given, that have the disk room for its headroom (a full one would refuse it)."""
    return _beating(ctx, lambda b: template_id in b.templates and (disk is None or disk.fits(b)))


def disk_need(ctx: ApiContext, tpl: dict[str, Any]) -> DiskNeed:
    """What a create from the template row `tpl` needs of a node's disk: its capture and
    the disks under it where it is not held (sizes from its upload record; unknown: 0),
    and the headroom."""
    fetched = template_bytes(tpl.get("capture_bytes"), tpl.get("image_bytes"))
    return DiskNeed(tpl["template_id"], fetched, ctx.settings.disk_headroom_bytes)


def _beating(ctx: ApiContext, which: Callable[[Heartbeat], bool]) -> tuple[str, ...]:
    beats = ctx.nodes.current() if ctx.nodes is not None else None
    if not beats:
        return ()
    now = time.time()
    return tuple(sorted(b.node_id for b in beats.values() if which(b) and takes_new(b, now)))


async def withdraw(ctx: ApiContext, cmd: sb.CreateSandbox, actor: str | None) -> bool:
    """No node took `cmd` in time: record it failed, unless a node claimed it meanwhile
    (`bus.steps.withdraw_create`). True when the failure is the API's (the answer is then
    `no_room`)."""
    why = f"no node took it within {ctx.settings.placement_timeout_s:.0f} s: none had room for it"
    return await withdraw_create(ctx.bus, cmd, why=why, actor=actor)


async def place_create(
    ctx: ApiContext, cmd: sb.CreateSandbox, node: str | None, actor: str | None
) -> Event:
    """Send `cmd` to `node` (None: to placement, withdrawn if no node takes it in time) and
    wait for it to start: the event that ended the wait (`SandboxCreated` or a failure), or
    `no_room` raised when the withdrawal was the API's."""
    withdrawn = False

    async def unclaimed() -> None:
        nonlocal withdrawn
        withdrawn = await withdraw(ctx, cmd, actor)

    event, _ = await send_and_wait(
        ctx.bus,
        cmd,
        node_id=node,
        until=(sb.SandboxCreated,),
        timeout=ctx.settings.create_timeout_s,
        actor=actor,
        unclaimed=unclaimed if node is None else None,
        claim_within=ctx.settings.placement_timeout_s,
    )
    if withdrawn:
        raise no_room(cmd, ctx.settings.placement_timeout_s)
    return event


def no_room(cmd: sb.CreateSandbox, timeout_s: float) -> ApiError:
    return ApiError(
        503,
        f"no node took sandbox {cmd.sandbox_id} within {timeout_s:.0f} s: none had room for it",
        headers=_RETRY,
    )
