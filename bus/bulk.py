"""Ending many sandboxes at once: a bulk kill or pause by metadata (the API's
`POST /sandboxes/bulk/…`) and a lease's end (the lease timer), written once for both.

A caller finds the sandboxes (`Member`s, from the read model: a query by metadata) and
this module says which of them an action applies to and sends each its command, with an
id derived from (`tag`, sandbox, the sandbox's revision): a sweep repeated before the
sandbox changed publishes the same ids (JetStream keeps one), and a sandbox that moved on
(resumed after a lease's pause) gets a fresh command.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from bus.connection import Bus
from bus.envelope import MessageContext
from bus.steps import kill_in_log
from domain import sandbox as sb

__all__ = ["Action", "Member", "acted_on", "end_command", "send_ends"]

Action = Literal["kill", "pause"]

#: statuses a kill no longer applies to (being killed, or ended)
_ENDED = (sb.SandboxStatus.KILLING, sb.SandboxStatus.KILLED, sb.SandboxStatus.FAILED)


@dataclass(frozen=True)
class Member:
    """One sandbox a bulk action or a lease found, as the read model had it."""

    sandbox_id: str
    node_id: str | None
    status: sb.SandboxStatus
    #: the sandbox's aggregate version when it was read
    revision: int


def acted_on(members: Iterable[Member], action: Action) -> list[Member]:
    """The members `action` applies to: a kill, every one not being killed or ended; a
    pause, the running ones (a paused or pausing one is paused already; one still being
    created or resumed is paused by a later sweep, once it runs)."""
    if action == "kill":
        return [m for m in members if m.status not in _ENDED]
    return [m for m in members if m.status is sb.SandboxStatus.RUNNING]


def end_command(member: Member, action: Action, *, tag: str) -> sb.KillSandbox | sb.PauseSandbox:
    """The command ending `member`; `reason` is "timeout" for a lease's expiry (a TTL
    of the lease's), "request" for a client's."""
    command_id = sb.derived_command_id(tag, member.sandbox_id, str(member.revision), action)
    reason: Literal["timeout", "request"] = "timeout" if tag.startswith("lease-exp") else "request"
    if action == "kill":
        return sb.KillSandbox(sandbox_id=member.sandbox_id, command_id=command_id, reason=reason)
    return sb.PauseSandbox(sandbox_id=member.sandbox_id, command_id=command_id, reason=reason)


async def send_ends(
    bus: Bus,
    members: Iterable[Member],
    action: Action,
    *,
    tag: str,
    actor: str | None,
    gone: Callable[[str], Awaitable[bool]],
) -> list[str]:
    """Send `action` to every member it applies to, without waiting for the outcomes;
    a kill of a sandbox whose node stopped beating (`gone`) is recorded in the log, as
    the API's and the timer's are. Returns the ids sent to."""
    context = MessageContext(actor=actor)
    sent: list[str] = []
    for member in acted_on(members, action):
        cmd = end_command(member, action, tag=tag)
        node = member.node_id
        if isinstance(cmd, sb.KillSandbox) and node is not None and await gone(node):
            why = f"node {node} is gone; killed in the log ({tag})"
            await kill_in_log(bus, cmd, node, why=why, actor=actor, moot_ok=True)
        elif node is not None:
            await bus.commands.to_node(node, cmd, context=context)
        else:
            await bus.commands.to_placement(cmd, context=context)
        sent.append(member.sandbox_id)
    return sent
