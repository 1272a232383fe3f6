"""The request flow the API and the node worker will run: publish a command, the node
loads/decides/appends/acts/completes, the API waits for the outcome on the aggregate subject."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from bus import Bus, Delivery
from domain import CommandRejected
from domain import sandbox as sb
from domain.sandbox.values import new_sandbox_id
from tests.integration.bus.helpers import consumer

T0 = datetime(2026, 1, 1, tzinfo=UTC)
OUTCOMES = (sb.SandboxCreated, sb.SandboxFailed, sb.SandboxPaused, sb.SandboxKilled)


async def node_worker(bus: Bus, d: Delivery) -> None:
    """What workers/node will do, minus the VM: decide, append, (act), complete, append."""
    assert isinstance(d.command, sb.SandboxCommand)
    sid = d.command.sandbox_id
    state, version = await bus.sandboxes.load(sid)
    events = sb.decide(state, d.command)
    version = await bus.sandboxes.append(sid, version, events, context=d.context)
    state = sb.fold(events, state)
    if isinstance(d.command, sb.CreateSandbox) and events:
        await asyncio.sleep(0)  # the VM would boot here
        done = sb.decide(state, sb.CompleteCreate(sandbox_id=sid, node_id="n1"))
        await bus.sandboxes.append(sid, version, done, context=d.context)


async def test_create_then_wait_for_the_outcome(bus: Bus) -> None:
    async def handler(d: Delivery) -> None:
        await node_worker(bus, d)

    async with consumer(bus, handler) as (_, node):
        sid = new_sandbox_id()
        cmd = sb.CreateSandbox(sandbox_id=sid, template_id="base", at=T0)
        # the API: note the version, start waiting, then publish (no race)
        version = await bus.sandboxes.version(sid)
        waiting = asyncio.create_task(
            bus.sandboxes.wait_for_outcome(sid, cmd.command_id, version.seq, OUTCOMES, timeout=10)
        )
        await bus.commands.to_node(node, cmd)
        rec = await waiting
        assert rec is not None and isinstance(rec.event, sb.SandboxCreated)
        assert rec.envelope.causation_id == cmd.command_id

        # a refused command answers with its rejection on the same subject (404 here)
        missing = new_sandbox_id()
        kill = sb.KillSandbox(sandbox_id=missing, at=T0)

        waiting = asyncio.create_task(
            bus.sandboxes.wait_for_outcome(missing, kill.command_id, 0, OUTCOMES, timeout=10)
        )
        await bus.commands.to_node(node, kill)
        rec = await waiting
        assert rec is not None and isinstance(rec.event, CommandRejected)
        assert rec.event.code == "not_found"


async def test_wait_times_out_with_none(bus: Bus) -> None:
    sid = new_sandbox_id()
    cmd = sb.PauseSandbox(sandbox_id=sid)
    assert (
        await bus.sandboxes.wait_for_outcome(sid, cmd.command_id, 0, OUTCOMES, timeout=0.2) is None
    )
