"""Send a command and wait for the event that answers it (design §3).

The answer is read from the log (`bus.answers`: the process follows every stored sandbox
event), registered *before* publishing so it cannot slip past, and matched on
`causation_id` = the command id — never from a plain subscription, which also delivers
appends the stream refused. A refusal (`CommandRejected`) maps to the HTTP error it stands
for; silence past the deadline is a 504 naming the command, whose work still completes and
shows up later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aenv.domain import CommandRejected, Event
from aenv.domain import sandbox as sb
from api.errors import ApiError
from bus import Bus, MessageContext

REJECTION_STATUS = {"not_found": 404, "conflict": 409, "invalid": 400, "permanent": 400}

Publish = Callable[[], Awaitable[object]]


async def send_and_wait(
    bus: Bus,
    command: sb.SandboxCommand,
    *,
    node_id: str | None,
    until: tuple[type[Event], ...],
    timeout: float,
    actor: str | None = None,
) -> tuple[Event, int]:
    """Publish `command` (to its node, or to placement) and return the first event it causes
    that is one of `until` (or a failure), with its aggregate version."""
    kinds: tuple[type[Event], ...] = (CommandRejected, *until, sb.SandboxFailed)
    answers = await bus.answers()
    answer = answers.expect(str(command.command_id), lambda rec: isinstance(rec.event, kinds))
    try:
        ctx = MessageContext(correlation_id=command.command_id, actor=actor)
        if node_id is None:
            await bus.commands.to_placement(command, context=ctx)
        else:
            await bus.commands.to_node(node_id, command, context=ctx)
        try:
            rec = await asyncio.wait_for(answer, timeout)
        except TimeoutError:
            raise ApiError(
                504,
                f"command {command.command_id} accepted but not finished within "
                f"{timeout:.0f}s; it continues in the background",
                headers={"Should-Retry": "false"},
            ) from None
        event, version = rec.event, rec.envelope.aggregate_version
        if isinstance(event, CommandRejected):
            raise ApiError(REJECTION_STATUS.get(event.code, 500), event.reason)
        return event, version
    finally:
        answers.forget(str(command.command_id))
