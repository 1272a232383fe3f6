"""The one resume policy: how a paused sandbox comes back, for the `resume` and `connect`
routes and for the proxy's auto-resume alike (`shared.proxy.RouteTable` is handed
`auto_resume`), so a request that wakes a sandbox behaves exactly like an explicit resume.

Where the command goes is `node_or_placement`: the node holding the capture, or — when
that node stopped beating or an operator cordoned it (a drain), and the capture is durable
in the snapshot repository — any node (placement), which pulls it. A capture stranded on a
dead node's disk is a clear 503, never a wait on a queue nobody reads.
"""

from __future__ import annotations

import asyncio
import time

from api.context import ApiContext
from api.cordons import cordoned
from api.errors import ApiError
from api.outcomes import send_and_wait
from api.room import RETRY_AFTER_S, check_room
from domain import sandbox as sb
from domain.sandbox import SandboxStatus
from shared.proxy import AutoResume

__all__ = ["LIVE", "auto_resume", "node_or_placement", "resume"]

#: States in which a sandbox runs (E2B's "running").
LIVE = frozenset({SandboxStatus.RUNNING, SandboxStatus.SNAPSHOTTING, SandboxStatus.FORKING})
#: A transition someone else started, which a resume waits out before it decides.
_IN_FLIGHT = (SandboxStatus.PAUSING, SandboxStatus.RESUMING)


async def node_or_placement(
    ctx: ApiContext, node: str | None, *, durable: bool, stranded: str
) -> str | None:
    """Where a command needing a capture goes: the node holding it, else (that node gone
    or cordoned, the capture durable) placement. Gone with the capture only on its disk:
    503 `stranded`; cordoned with it only there: still that node (a drain uploads it)."""
    if node is None:
        return None
    if not await ctx.node_gone(node):
        return None if durable and await cordoned(ctx, node) else node
    if durable:
        return None
    raise ApiError(503, stranded, headers={"Retry-After": str(RETRY_AFTER_S)})


async def _settled(ctx: ApiContext, state: sb.Sandbox) -> sb.Sandbox:
    """The state once a pause or resume under way has finished (e.g. the TTL's pause just
    fired, or a concurrent request is resuming it): a resume decides on where it ended."""
    deadline = time.monotonic() + ctx.settings.command_timeout_s
    while state.status in _IN_FLIGHT and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        fresh, _ = await ctx.bus.sandboxes.load(state.sandbox_id)
        if fresh is None:
            raise ApiError(404, f'sandbox "{state.sandbox_id}" not found')
        state = fresh
    return state


async def _resumed_by_another(ctx: ApiContext, state: sb.Sandbox) -> sb.Sandbox | None:
    """The state, if a resume refused as a conflict lost the race to another request's (a
    second client, the proxy's auto-resume, a redelivered one) and the sandbox runs: the
    caller wanted it running, and it is. None: the conflict stands."""
    fresh, _ = await ctx.bus.sandboxes.load(state.sandbox_id)
    if fresh is None:
        return None
    fresh = await _settled(ctx, fresh)
    return fresh if fresh.status in LIVE else None


async def resume(
    ctx: ApiContext, state: sb.Sandbox, *, timeout_s: int | None, actor: str | None
) -> sb.Sandbox:
    """Bring `state`'s sandbox back and return its state as it runs. `timeout_s` None keeps
    the TTL it had left when paused."""
    state = await _settled(ctx, state)
    if state.status in LIVE:
        return state
    node = await node_or_placement(
        ctx,
        state.node_id,
        durable=state.resumable_anywhere,
        stranded=f"sandbox {state.sandbox_id} is paused on node {state.node_id}, which is "
        "not running, and its capture has not reached the snapshot repository: "
        "it resumes once that node is back",
    )
    if node is None:  # its node is gone: another must have room for it
        check_room(ctx, state.cpu_count, state.memory_mb)
    try:
        event, _ = await send_and_wait(
            ctx.bus,
            sb.ResumeSandbox(sandbox_id=state.sandbox_id, timeout_s=timeout_s),
            node_id=node,
            until=(sb.SandboxResumed, sb.SandboxResumeFailed),
            timeout=ctx.settings.command_timeout_s,
            actor=actor,
        )
    except ApiError as e:
        if e.status == 409 and (running := await _resumed_by_another(ctx, state)):
            return running
        raise
    if isinstance(event, sb.SandboxResumeFailed):
        # Its own node gone, another refused it (its capture over other bytes, the
        # repository out of reach): like a capture not yet durable, it waits for its node
        # — a 503, not a fault of ours. On its own node a refusal stays a 500.
        raise ApiError(
            503 if node is None else 500,
            f"sandbox {state.sandbox_id} could not be resumed and stays "
            f"paused (try again later): {event.reason}",
            headers={"Retry-After": str(RETRY_AFTER_S)} if node is None else None,
        )
    if isinstance(event, sb.SandboxFailed):
        raise ApiError(500, f"sandbox {state.sandbox_id} failed to resume: {event.reason}")
    assert isinstance(event, sb.SandboxResumed)
    # what the answer needs changed only by this event: no reload on the response path
    return state.model_copy(
        update={"status": SandboxStatus.RUNNING, "node_id": event.node_id, "end_at": event.end_at}
    )


def auto_resume(ctx: ApiContext) -> AutoResume:
    """The policy as the proxy's route table calls it, for a request to a paused sandbox."""

    async def run(state: sb.Sandbox) -> None:
        await resume(ctx, state, timeout_s=None, actor="auto-resume")

    return run
