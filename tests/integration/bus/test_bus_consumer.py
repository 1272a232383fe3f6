"""The consumer wrapper against a real durable consumer: how each outcome settles a message."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable
from datetime import UTC, datetime

from bus import (
    Bus,
    CommandConsumer,
    ConcurrencyError,
    ConsumerSpec,
    Delivery,
    PermanentError,
    RetryableError,
)
from bus import headers as h
from bus.envelope import CommandEnvelope
from domain import CommandRejected, Conflict
from domain import sandbox as sb
from domain import template as tp
from domain.sandbox.values import new_sandbox_id
from tests.integration.bus.helpers import Recorder, consumer, pending_in_queue, rejections
from tests.support import eventually

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def pause(sid: str) -> sb.PauseSandbox:
    return sb.PauseSandbox(sandbox_id=sid, at=T0)


async def ok(_: Delivery) -> None:
    return None


async def test_success_acks(bus: Bus) -> None:
    async with consumer(bus, ok) as (rec, node):
        cmd = pause(new_sandbox_id())
        await bus.commands.to_node(node, cmd)
        await eventually(lambda: _true(rec.done == [str(cmd.command_id)]))
        # work-queue retention: an acked command is gone from the stream
        await eventually(lambda: _eq0(pending_in_queue(bus, node)))
        assert rec.attempts[str(cmd.command_id)] == [1]


async def test_command_published_twice_runs_once(bus: Bus) -> None:
    async with consumer(bus, ok) as (rec, node):
        cmd = pause(new_sandbox_id())
        r1 = await bus.commands.to_node(node, cmd)
        r2 = await bus.commands.to_node(node, cmd)
        assert not r1.duplicate and r2.duplicate and r1.seq == r2.seq
        await eventually(lambda: _true(len(rec.done) == 1))
        other = pause(new_sandbox_id())
        await bus.commands.to_node(node, other)  # a later command still flows
        await eventually(lambda: _true(len(rec.done) == 2))
        assert rec.done == [str(cmd.command_id), str(other.command_id)]


async def test_retryable_naks_then_succeeds(bus: Bus) -> None:
    async def flaky(d: Delivery) -> None:
        if d.attempt == 1:
            raise RetryableError("vmm busy", delay_s=0.05)

    async with consumer(bus, flaky) as (rec, node):
        cmd = pause(new_sandbox_id())
        await bus.commands.to_node(node, cmd)
        await eventually(lambda: _true(rec.done == [str(cmd.command_id)]))
        assert rec.attempts[str(cmd.command_id)] == [1, 2]


async def test_permanent_terms_and_rejects(bus: Bus) -> None:
    async def broken(_: Delivery) -> None:
        raise PermanentError("template image is corrupt")

    async with consumer(bus, broken) as (rec, node):
        sid = new_sandbox_id()
        cmd = pause(sid)
        await bus.commands.to_node(node, cmd)
        [r] = await eventually(lambda: rejections(bus, sid))
        assert (r.code, r.command_id, r.command_type) == (
            "permanent",
            cmd.command_id,
            "PauseSandbox",
        )
        assert "corrupt" in r.reason
        await eventually(lambda: _eq0(pending_in_queue(bus, node)))
        assert rec.attempts[str(cmd.command_id)] == [1]  # terminated: never redelivered
        [recorded] = [x for x in await bus.sandboxes.read(sid)]
        assert recorded.envelope.causation_id == cmd.command_id


async def test_domain_error_rejects_with_its_code(bus: Bus) -> None:
    async def conflict(_: Delivery) -> None:
        raise Conflict("cannot fork a sandbox that is paused")

    async with consumer(bus, conflict) as (_, node):
        sid = new_sandbox_id()
        await bus.commands.to_node(node, pause(sid))
        [r] = await eventually(lambda: rejections(bus, sid))
        assert r.code == "conflict"


async def test_crash_retries_until_max_deliver_then_rejects(bus: Bus) -> None:
    async def crash(_: Delivery) -> None:
        raise RuntimeError("bug")

    async with consumer(bus, crash) as (rec, node):
        sid = new_sandbox_id()
        cmd = pause(sid)
        await bus.commands.to_node(node, cmd)
        [r] = await eventually(lambda: rejections(bus, sid))
        assert r.code == "internal" and "gave up after 3 attempts" in r.reason
        assert rec.attempts[str(cmd.command_id)] == [1, 2, 3]


async def test_invalid_command_is_rejected(bus: Bus) -> None:
    async with consumer(bus, ok) as (rec, node):
        sid = new_sandbox_id()
        cmd = pause(sid)
        env = CommandEnvelope(
            command_id=cmd.command_id,
            type="PauseSandbox",
            schema_version=1,
            aggregate_id=sid,
            issued_at=T0,
            payload={"sandbox_id": sid, "at": T0.isoformat(), "bogus": 1},
        )
        await bus.js.publish(
            bus.names.node_command(node, "pause"),
            env.model_dump_json().encode(),
            headers={h.MSG_ID: str(cmd.command_id)},
        )
        [r] = await eventually(lambda: rejections(bus, sid))
        assert r.code == "invalid" and "bogus" in r.reason
        assert rec.attempts == {}


async def test_long_work_is_kept_alive_by_heartbeats(bus: Bus) -> None:
    async def slow(_: Delivery) -> None:
        await asyncio.sleep(1.3)  # twice the ack deadline: only heartbeats prevent redelivery

    async with consumer(bus, slow, ack_wait_s=0.6, backoff=(0.6, 0.6)) as (rec, node):
        cmd = pause(new_sandbox_id())
        await bus.commands.to_node(node, cmd)
        await eventually(lambda: _true(rec.done == [str(cmd.command_id)]), timeout=10)
        assert rec.attempts[str(cmd.command_id)] == [1]


async def test_stop_drains_in_flight_work(bus: Bus) -> None:
    started = asyncio.Event()

    async def slow(_: Delivery) -> None:
        started.set()
        await asyncio.sleep(0.3)

    async with consumer(bus, slow) as (rec, node):
        cmd = pause(new_sandbox_id())
        await bus.commands.to_node(node, cmd)
        await asyncio.wait_for(started.wait(), 10)
    # the context manager stopped the consumer while the handler slept: it still finished
    assert rec.done == [str(cmd.command_id)]
    assert await pending_in_queue(bus, node) == 0


async def _true(value: bool) -> bool:
    return value


async def _eq0(count: Awaitable[int]) -> bool:
    return await count == 0


async def test_concurrency_error_is_retried_at_once(bus: Bus) -> None:
    async def racing(d: Delivery) -> None:
        if d.attempt == 1:
            raise ConcurrencyError("aenv.evt.sandbox.x", 3, "wrong last sequence: 4")

    async with consumer(bus, racing, backoff=(5.0, 5.0)) as (rec, node):
        cmd = pause(new_sandbox_id())
        await bus.commands.to_node(node, cmd)
        # well before the 5 s backoff: the conflict retry does not wait for it
        await eventually(lambda: _true(rec.done == [str(cmd.command_id)]), timeout=3)
        assert rec.attempts[str(cmd.command_id)] == [1, 2]


async def test_a_template_command_is_rejected_on_the_templates_subject(bus: Bus) -> None:
    """A node refusing a template import: whoever waits on the template's subject hears why
    at once (it used to land on `aenv.evt.sandbox.<template>`, and the waiter timed out)."""

    async def refuse(_: Delivery) -> None:
        raise PermanentError("image /nowhere: no such OCI layout")

    async with consumer(bus, refuse) as (_, node):
        name = f"tpl-{new_sandbox_id()}"
        cmd = tp.ImportTemplateImage(template_id=name, image_path="/nowhere", at=T0)
        version = await bus.templates.version(name)
        waiting = asyncio.create_task(
            bus.templates.wait_for_outcome(
                name, cmd.command_id, version.seq, (tp.TemplateImported,), timeout=10.0
            )
        )
        await bus.commands.to_node(node, cmd)
        rec = await asyncio.wait_for(waiting, 10.0)
        assert rec is not None and isinstance(rec.event, CommandRejected)
        assert rec.event.code == "permanent" and "no such OCI layout" in rec.event.reason
        assert rec.subject == bus.templates.subject(name)
        assert await bus.sandboxes.read(name) == []  # nothing on a sandbox subject


async def test_an_undecodable_command_is_rejected_on_its_kind_even_without_the_field(
    bus: Bus,
) -> None:
    """A pipeline's hand-written envelope without `aggregate_kind`: the type says which."""
    async with consumer(bus, ok) as (rec, node):
        name = f"tpl-{new_sandbox_id()}"
        cmd = tp.DeleteTemplate(template_id=name, at=T0)
        env = CommandEnvelope(
            command_id=cmd.command_id,
            type="DeleteTemplate",
            schema_version=1,
            aggregate_id=name,
            issued_at=T0,
            payload={"template_id": name, "at": T0.isoformat(), "bogus": 1},
        )
        raw = env.model_dump(mode="json")
        del raw["aggregate_kind"]
        await bus.js.publish(
            bus.names.node_command(node, "template-delete"),
            json.dumps(raw).encode(),
            headers={h.MSG_ID: str(cmd.command_id)},
        )
        [r] = await eventually(lambda: _template_rejections(bus, name))
        assert r.code == "invalid" and "bogus" in r.reason
        assert rec.attempts == {}


async def _template_rejections(bus: Bus, name: str) -> list[CommandRejected]:
    return [r.event for r in await bus.templates.read(name) if isinstance(r.event, CommandRejected)]


async def test_a_command_to_each_node_reaches_every_node(bus: Bus) -> None:
    """A template delete goes to every node that may hold a copy. One command id sent to two
    queues is one message to JetStream (de-duplication is stream-wide): only the first node
    would act. Each copy has an id of its own; sending again still acts once per node."""
    async with consumer(bus, ok) as (first, a), consumer(bus, ok) as (second, b):
        cmd = tp.DeleteTemplate(template_id=f"tpl-{new_sandbox_id()}", at=T0)
        receipts = await bus.commands.to_each_node([a, b, a], cmd)
        assert len({r.command_id for r in receipts}) == 2 and not any(r.duplicate for r in receipts)
        again = await bus.commands.to_each_node([b, a], cmd)
        assert all(r.duplicate for r in again)
        await eventually(lambda: _true(len(first.done) == 1 and len(second.done) == 1))
        assert first.done != second.done


async def test_a_redelivery_waits_for_the_delivery_still_running_here(bus: Bus) -> None:
    """A command redelivered while this process still runs its earlier delivery (the
    heartbeats were lost: NATS restarted under the work) runs after it, never beside it.
    Beside it, a node redid a fork in flight, and the second run's completion — refused
    (the fork had already finished) — gave the fork a second outcome in the log."""
    running: list[int] = []
    overlapped: list[int] = []

    async def slow_and_deaf(d: Delivery) -> None:
        if running:
            overlapped.append(d.attempt)
        running.append(d.attempt)
        try:
            if d.attempt == 1:
                # the server hears none of this delivery's heartbeats, as in an outage
                d._msg.in_progress = _lost  # type: ignore[method-assign]
                await asyncio.sleep(1.5)  # well past the 0.3 s deadline: redelivered meanwhile
        finally:
            running.remove(d.attempt)

    async with consumer(bus, slow_and_deaf, ack_wait_s=0.3, backoff=(0.3, 0.3), max_deliver=5) as (
        rec,
        node,
    ):
        cmd = pause(new_sandbox_id())
        await bus.commands.to_node(node, cmd)
        await eventually(lambda: _true(len(rec.attempts[str(cmd.command_id)]) >= 2), timeout=10)
        await eventually(lambda: _eq0(pending_in_queue(bus, node)), timeout=10)
        assert overlapped == []
        assert rec.attempts[str(cmd.command_id)] == [1, 2]  # the second waited, then ran once


async def _lost() -> None:
    return None


async def test_a_consumer_made_before_keeps_what_jetstream_cannot_change(bus: Bus) -> None:
    """An older aenv made the shared `place` consumer with the server's `max_waiting`:
    JetStream refuses to change it, and a node starting with a larger one must still start
    (and settle messages), keeping the old value."""
    node = f"n{secrets.token_hex(3)}"
    durable = bus.names.node_consumer(node)
    from nats.js.api import AckPolicy, ConsumerConfig

    await bus.js.add_consumer(
        bus.names.command_stream,
        ConsumerConfig(
            durable_name=durable,
            filter_subject=bus.names.node_commands(node),
            ack_policy=AckPolicy.EXPLICIT,
        ),
    )
    before = (await bus.js.consumer_info(bus.names.command_stream, durable)).config.max_waiting
    rec = Recorder(ok)
    spec = ConsumerSpec(
        durable=durable,
        filter_subject=bus.names.node_commands(node),
        max_deliver=3,
        backoff=(0.1, 0.2),
        fetch_timeout_s=0.2,
        max_waiting=before + 100,
        parallel=2,
    )
    c = CommandConsumer(bus.js, bus.settings, spec, rec, bus.rejection_sinks)
    await c.start()
    try:
        cmd = pause(new_sandbox_id())
        await bus.commands.to_node(node, cmd)
        await eventually(lambda: _true(rec.done == [str(cmd.command_id)]))
        info = await bus.js.consumer_info(bus.names.command_stream, durable)
        assert info.config.max_waiting == before
    finally:
        await c.stop()
        await bus.js.delete_consumer(bus.names.command_stream, durable)
