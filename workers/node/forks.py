"""A fork on its parent's node: one capture of the parent, `count` copy-on-write children.
Each child is a sandbox of its own — its create decided on its own stream, with a fresh
access token and `forked_from` lineage — started beside its parent (a fork never goes
through placement), and the parent's stream records the outcome."""

from __future__ import annotations

import asyncio
import secrets

from bus import MessageContext
from bus.decisions import execute
from domain import sandbox as sb
from domain.sandbox import SandboxStatus as S
from workers.node.capacity import size_of
from workers.node.completions import completion_id
from workers.node.ports import HostError
from workers.node.site import NodeSite

__all__ = ["fork"]


async def fork(w: NodeSite, cmd: sb.ForkSandbox, ctx: MessageContext) -> None:
    """One capture of the parent, `count` copy-on-write children on this node. Each
    child is a sandbox of its own (its create decided on its own stream, with a fresh
    access token and `forked_from` lineage); the parent's stream records the outcome."""
    state, _, _ = await execute(w.bus.sandboxes, cmd, ctx)
    if state is None or state.status is not S.FORKING:
        return
    try:
        await _children(w, cmd, ctx, state)
    finally:
        for cid in state.pending_children:
            if not w.host.runs(cid):
                w.capacity.release(cid)


async def _children(
    w: NodeSite, cmd: sb.ForkSandbox, ctx: MessageContext, state: sb.Sandbox
) -> None:
    creates: dict[str, sb.CreateSandbox] = {}
    #: each child's traffic token as its log has it (a redone fork minted new ones)
    tokens: dict[str, str | None] = {}
    for cid in state.pending_children:
        create = sb.fork_child_command(state, cid, cmd)
        if state.envd_access_token is not None:
            create = create.model_copy(update={"envd_access_token": secrets.token_urlsafe(24)})
        if state.traffic_access_token is not None:  # a child's guest ports: its own key
            create = create.model_copy(update={"traffic_access_token": secrets.token_urlsafe(24)})
        placed = create.model_copy(update={"node_id": w.node_id})
        # journaled before its request is in the log: a node that dies from here on
        # leaves the child to its reconcile (lost), never `creating` for ever
        w.journal.add(cid, state.template_id)
        child, _, _ = await execute(w.bus.sandboxes, placed, ctx)
        if child is not None and child.status is S.CREATING:
            # the tokens the log has: a redone fork (its child requested by an earlier
            # delivery) minted new ones the log never took, which its guest must not get
            creates[cid] = create.model_copy(update={"envd_access_token": child.envd_access_token})
            tokens[cid] = child.traffic_access_token
    for cid in state.pending_children:
        if cid not in creates and not w.host.runs(cid):
            w.journal.remove(cid)  # not ours to start (it existed already)
    errors: dict[str, str | None] = {}
    refused: sb.FailureCode | None = None  # why the whole fork was refused, if it was
    size, new = size_of(state), [cid for cid in creates if not w.capacity.holds(cid)]
    if w.capacity.fits(size, len(new)):
        for cid in new:
            w.capacity.take(cid, size)
        creates_to_start = creates
    else:  # each child told why: the fork answers, its children fail
        room = w.capacity.room()
        why = (
            f"node {w.node_id} has no room for {len(new)} more sandboxes of "
            f"{size.vcpus} vCPU / {size.mem_mib} MiB ({room.free_vcpus} vCPU, "
            f"{room.free_mem_mib} MiB, {room.free_sandboxes} sandboxes left)"
        )
        errors = dict.fromkeys(creates, why)
        creates_to_start = {}
    async with w.host.lock(cmd.sandbox_id):
        try:
            guests = {cid: w.guest_config(c) for cid, c in creates_to_start.items()}
            if guests:
                errors = await w.host.fork(cmd.sandbox_id, guests)
        except HostError as e:
            errors = {cid: str(e) for cid in creates}
            if e.code == "unavailable":  # a fork refused for disk: another node may fit it
                refused = "unavailable"
    await asyncio.gather(
        *(w.route_publisher.put(cid, tokens[cid]) for cid in creates if errors.get(cid) is None)
    )
    for cid, create in creates.items():
        if errors.get(cid) is not None:
            w.journal.remove(cid)
        done = sb.CompleteCreate(
            sandbox_id=cid,
            node_id=w.node_id,
            error=errors.get(cid),
            code=refused if errors.get(cid) is not None else None,
            command_id=completion_id(create, "created"),
        )
        await execute(w.bus.sandboxes, done, ctx)
    results = tuple(
        sb.ForkChildResult(sandbox_id=cid, error=errors.get(cid, "child already existed"))
        if cid in creates
        else sb.ForkChildResult(sandbox_id=cid, error=None)
        for cid in state.pending_children
    )
    finished = sb.CompleteFork(
        sandbox_id=cmd.sandbox_id, children=results, command_id=completion_id(cmd, "forked")
    )
    await execute(w.bus.sandboxes, finished, ctx)
