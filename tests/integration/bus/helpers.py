"""Helpers of the consumer tests: a scripted handler and a consumer that cleans up."""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from bus import Bus, CommandConsumer, ConsumerSpec, Delivery
from domain import CommandRejected

Behaviour = Callable[[Delivery], Awaitable[None]]


class Recorder:
    """A handler whose behaviour is scripted per test; remembers every attempt."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.attempts: dict[str, list[int]] = defaultdict(list)
        self.done: list[str] = []

    async def __call__(self, d: Delivery) -> None:
        self.attempts[str(d.envelope.command_id)].append(d.attempt)
        await self.behaviour(d)
        self.done.append(str(d.envelope.command_id))


@asynccontextmanager
async def consumer(
    bus: Bus, behaviour: Behaviour, **spec: object
) -> AsyncIterator[tuple[Recorder, str]]:
    node = f"n{secrets.token_hex(3)}"
    rec = Recorder(behaviour)
    fields: dict[str, object] = {
        "durable": bus.names.node_consumer(node),
        "filter_subject": bus.names.node_commands(node),
        "max_deliver": 3,
        "backoff": (0.1, 0.2),
        "ack_wait_s": 2.0,
        "fetch_timeout_s": 0.2,
        "drain_timeout_s": 5.0,
    }
    fields.update(spec)
    c = CommandConsumer(
        bus.js,
        bus.settings,
        ConsumerSpec(**fields),  # type: ignore[arg-type]
        rec,
        bus.rejection_sinks,
    )
    await c.start()
    try:
        yield rec, node
    finally:
        await c.stop()
        await bus.js.delete_consumer(bus.names.command_stream, str(fields["durable"]))


async def pending_in_queue(bus: Bus, node: str) -> int:
    info = await bus.js.stream_info(
        bus.names.command_stream, subjects_filter=bus.names.node_commands(node)
    )
    return sum((info.state.subjects or {}).values())


async def rejections(bus: Bus, sid: str) -> list[CommandRejected]:
    return [r.event for r in await bus.sandboxes.read(sid) if isinstance(r.event, CommandRejected)]
