"""Send a command and wait for the event that answers it (design §3).

We subscribe to the aggregate's subject *before* publishing, so the outcome cannot slip
past, and match on `causation_id` = the command id. A refusal (`CommandRejected`) maps to
the HTTP error it stands for; silence past the deadline is a 504 naming the command, whose
work still completes and shows up later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg

from aenv.domain import CommandRejected, Event
from aenv.domain import sandbox as sb
from api.errors import ApiError
from bus import Bus, MessageContext
from bus.envelope import decode_event

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
    subject = bus.names.sandbox_events(command.sandbox_id)
    # Settled in the subscription's callback: the answer costs no queue hop or extra task
    # between the event arriving and the handler going on.
    answer: asyncio.Future[tuple[Event, int]] = asyncio.get_running_loop().create_future()

    async def collect(msg: Msg) -> None:
        if answer.done():
            return
        try:
            env, event = decode_event(msg.data)
        except Exception as e:  # an event we cannot read on our own subject: say so
            answer.set_exception(e)
            return
        if env.causation_id == command.command_id and isinstance(
            event, (CommandRejected, *until, sb.SandboxFailed)
        ):
            answer.set_result((event, env.aggregate_version))

    sub = await bus.nc.subscribe(subject, cb=collect)
    try:
        ctx = MessageContext(correlation_id=command.command_id, actor=actor)
        if node_id is None:
            await bus.commands.to_placement(command, context=ctx)
        else:
            await bus.commands.to_node(node_id, command, context=ctx)
        try:
            event, version = await asyncio.wait_for(answer, timeout)
        except TimeoutError:
            raise ApiError(
                504,
                f"command {command.command_id} accepted but not finished within "
                f"{timeout:.0f}s; it continues in the background",
                headers={"Should-Retry": "false"},
            ) from None
        if isinstance(event, CommandRejected):
            raise ApiError(REJECTION_STATUS.get(event.code, 500), event.reason)
        return event, version
    finally:
        await sub.unsubscribe()
