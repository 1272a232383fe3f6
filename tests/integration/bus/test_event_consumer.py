"""The event-log consumer wrapper against a real durable consumer of AENV_EVT: outcomes
settle events as the command wrapper settles commands, and the durable survives restarts
(the snapshot worker's to-do list is the log)."""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from datetime import UTC, datetime, timedelta

from bus import Bus, ConsumerSpec, RetryableError
from bus.decisions import execute
from bus.event_consumer import EventConsumer, EventDelivery
from bus.subjects import AggregateKind
from domain import sandbox as sb
from domain.sandbox.values import new_sandbox_id
from tests.support import eventually

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _spec(bus: Bus, durable: str) -> ConsumerSpec:
    return ConsumerSpec(
        durable=bus.names.durable(durable),
        filter_subject=bus.names.events_of_kind(AggregateKind.SANDBOX),
        max_deliver=100,
        backoff=(0.1, 0.2),
        fetch_timeout_s=0.2,
        start_time=datetime.now(UTC) - timedelta(seconds=1),
    )


async def _created(bus: Bus) -> str:
    sid = new_sandbox_id()
    await execute(bus.sandboxes, sb.CreateSandbox(sandbox_id=sid, template_id="base", at=T0))
    return sid


async def test_events_are_retried_until_handled_and_the_durable_survives_a_restart(
    bus: Bus,
) -> None:
    seen: Counter[str] = Counter()
    flaky: set[str] = set()

    async def handle(d: EventDelivery) -> None:
        sid = d.record.envelope.aggregate_id
        seen[sid] += 1
        if sid in flaky and seen[sid] < 3:
            raise RetryableError("not yet", delay_s=0.05)

    durable = f"evt-{secrets.token_hex(3)}"
    consumer = EventConsumer(bus.js, bus.settings, _spec(bus, durable), handle)
    await consumer.start()
    try:
        first = await _created(bus)
        flaky.add(second := await _created(bus))
        await eventually(lambda: _true(seen[first] == 1 and seen[second] == 3))
    finally:
        await consumer.stop()
    third = await _created(bus)  # appended while nobody consumes
    # a new spec asks for a newer start time: the durable keeps its own and resumes
    again = EventConsumer(bus.js, bus.settings, _spec(bus, durable), handle)
    await again.start()
    try:
        await eventually(lambda: _true(seen[third] == 1))
        await asyncio.sleep(0.3)
        assert (seen[first], seen[second]) == (1, 3)  # acked ones are not delivered again
    finally:
        await again.stop()
        await bus.js.delete_consumer(bus.names.event_stream, bus.names.durable(durable))


async def _true(value: bool) -> bool:
    return value
