"""Send a command and wait for the event that answers it (design §3).

We subscribe to the aggregate's subject *before* publishing, so the outcome cannot slip
past, and match on `causation_id` = the command id. A refusal (`CommandRejected`) maps to
the HTTP error it stands for; silence past the deadline is a 504 naming the command, whose
work still completes and shows up later.
"""

from __future__ import annotations

import asyncio
import time
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
    inbox: asyncio.Queue[Msg] = asyncio.Queue()

    async def collect(msg: Msg) -> None:
        inbox.put_nowait(msg)

    sub = await bus.nc.subscribe(subject, cb=collect)
    try:
        ctx = MessageContext(correlation_id=command.command_id, actor=actor)
        if node_id is None:
            await bus.commands.to_placement(command, context=ctx)
        else:
            await bus.commands.to_node(node_id, command, context=ctx)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ApiError(
                    504,
                    f"command {command.command_id} accepted but not finished within "
                    f"{timeout:.0f}s; it continues in the background",
                    headers={"Should-Retry": "false"},
                )
            try:
                msg = await asyncio.wait_for(inbox.get(), remaining)
            except TimeoutError:
                continue
            env, event = decode_event(msg.data)
            if env.causation_id != command.command_id:
                continue
            if isinstance(event, CommandRejected):
                raise ApiError(REJECTION_STATUS.get(event.code, 500), event.reason)
            if isinstance(event, (*until, sb.SandboxFailed)):
                return event, env.aggregate_version
    finally:
        await sub.unsubscribe()
