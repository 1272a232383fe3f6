"""Sandbox steps in the log that are not one command but a short sequence of them, written
once for every service that takes them (the API, the timer): each is a few `execute`s
whose order and command ids are what makes it safe to repeat or to race a node.

`kill_in_log`: a sandbox whose node is gone is killed without that node — no one takes
commands off a dead node's queue, so its kill and the kill's completion are recorded here,
and the node's queue is told to drop whatever it still holds should it come back.

`withdraw_create`: a create no node claimed in time is recorded as requested and failed by
its sender, both guarded by the aggregate's expected sequence, so either a node's claim
came first (its outcome answers) or the withdrawal did (a node that pulls the create later
finds it failed and decides nothing).

`drain_pauses`: a drain's pauses (the API's drain step, a node's own drain on stop), each
command id derived from the sandbox's revision in the log, so a repeated round sends
nothing new while a pause is on its way, and a sandbox resumed onto the node since is
paused again.
"""

from __future__ import annotations

from collections.abc import Iterable
from uuid import UUID

from bus.connection import Bus
from bus.decisions import execute
from bus.envelope import MessageContext
from domain import DomainError
from domain import sandbox as sb

__all__ = ["drain_pauses", "kill_in_log", "withdraw_create"]


async def kill_in_log(
    bus: Bus,
    kill: sb.KillSandbox,
    node_id: str | None,
    *,
    why: str,
    actor: str | None,
    done_id: UUID | None = None,
    moot_ok: bool = False,
) -> None:
    """Record `kill` and its completion (`why` its error) on the sandbox's stream, then tell
    `node_id`'s queue to drop the sandbox: a node that only lost NATS for a while, or comes
    back, drops the VM or capture it still holds for a sandbox the log says is killed.

    `done_id` is the completion's command id when the caller derives it itself (the
    timer's lost-node kills, whose ids every replica must derive alike); else it derives
    from `kill`'s. A domain error (the sandbox ended meanwhile) propagates — a client is
    told — unless `moot_ok` (the timer's expiry: one command of many, none waits on it).
    """
    context = MessageContext(actor=actor)
    done = sb.CompleteKill(
        sandbox_id=kill.sandbox_id,
        command_id=done_id or sb.derived_command_id(str(kill.command_id), "killed"),
        error=why,
    )
    for command in (kill, done):
        try:
            await execute(bus.sandboxes, command, context)
        except DomainError:
            if not moot_ok:
                raise
    if node_id is not None:
        await bus.commands.to_node(node_id, sb.drop_command(kill.sandbox_id, str(kill.command_id)))


async def withdraw_create(bus: Bus, cmd: sb.CreateSandbox, *, why: str, actor: str | None) -> bool:
    """No node claimed `cmd` in time: record it requested and failed (`why`), unless a node
    claimed it meanwhile. True when the failure is the sender's (it answers the client);
    False when a node's claim or outcome came first (that outcome answers)."""
    context = MessageContext(
        causation_id=cmd.command_id, correlation_id=cmd.command_id, actor=actor
    )
    try:
        state, _, ours = await execute(bus.sandboxes, cmd, context)
        if not ours or state is None or state.status is not sb.SandboxStatus.CREATING:
            return False  # a node's claim came first: its outcome answers
        failed = sb.CompleteCreate(
            sandbox_id=cmd.sandbox_id,
            node_id="",
            error=why,
            command_id=sb.derived_command_id(str(cmd.command_id), "unplaced"),
        )
        _, _, done = await execute(bus.sandboxes, failed, context)
        return bool(done)
    except DomainError:  # a node finished it meanwhile: its outcome answers
        return False


async def drain_pauses(
    bus: Bus,
    node_id: str,
    running: Iterable[tuple[str, int]],
    *,
    tag: str,
    actor: str | None,
) -> None:
    """Pause each `(sandbox, log revision)` of `running` on `node_id`, memory kept, through
    that node's own queue; `tag` names the drain in the derived command ids."""
    for sid, revision in running:
        pause = sb.PauseSandbox(
            sandbox_id=sid,
            keep_memory=True,
            command_id=sb.derived_command_id(tag, sid, str(revision)),
        )
        await bus.commands.to_node(node_id, pause, context=MessageContext(actor=actor))
