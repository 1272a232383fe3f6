"""The sandbox steps the API and the timer share (`bus.steps`), on the real log: a kill in
the log records the kill and its completion and queues the node's drop once however often
it is repeated; a withdrawn create fails only when no node claimed it first."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

import pytest

from bus import Bus
from bus.decisions import execute
from bus.steps import kill_in_log, withdraw_create
from domain import sandbox as sb
from domain.errors import NotFound
from domain.sandbox.values import new_sandbox_id
from tests.integration.bus.helpers import pending_in_queue

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _running(bus: Bus, node: str) -> str:
    sid = new_sandbox_id()
    await execute(
        bus.sandboxes, sb.CreateSandbox(sandbox_id=sid, template_id="base", at=T0, timeout_s=60)
    )
    await execute(bus.sandboxes, sb.CompleteCreate(sandbox_id=sid, node_id=node, at=T0))
    return sid


async def _history(bus: Bus, sid: str) -> list[str]:
    return [type(r.event).__name__ for r in await bus.sandboxes.read(sid)]


async def test_a_kill_in_the_log_kills_and_tells_the_node_once(bus: Bus) -> None:
    node = f"n{secrets.token_hex(3)}"
    sid = await _running(bus, node)
    kill = sb.KillSandbox(sandbox_id=sid, at=T0)
    await kill_in_log(bus, kill, node, why="node gone", actor="test")
    records = await bus.sandboxes.read(sid)
    killed = records[-1].event
    assert isinstance(killed, sb.SandboxKilled) and killed.error == "node gone"
    assert isinstance(records[-2].event, sb.SandboxKillRequested)
    assert await pending_in_queue(bus, node) == 1
    # the timer's repeat (another replica, a redelivery): moot, and the drop is queued once
    await kill_in_log(bus, kill, node, why="node gone", actor="test", moot_ok=True)
    assert (await _history(bus, sid))[-2:] == ["SandboxKillRequested", "SandboxKilled"]
    assert await pending_in_queue(bus, node) == 1


async def test_a_kill_in_the_log_of_an_ended_sandbox_is_an_error_unless_moot(bus: Bus) -> None:
    node = f"n{secrets.token_hex(3)}"
    sid = await _running(bus, node)
    await kill_in_log(bus, sb.KillSandbox(sandbox_id=sid, at=T0), node, why="x", actor="test")
    with pytest.raises(NotFound):  # the API's: the client is told
        await kill_in_log(bus, sb.KillSandbox(sandbox_id=sid, at=T0), node, why="x", actor="t")


async def test_a_kill_in_the_log_takes_the_completion_id_it_is_given(bus: Bus) -> None:
    node = f"n{secrets.token_hex(3)}"
    sid = await _running(bus, node)
    clock = sb.Clock(sandbox_id=sid, status=sb.SandboxStatus.RUNNING, node_id=node)
    kill, done = sb.orphan_commands(clock, "lost")
    assert isinstance(kill, sb.KillSandbox)
    await kill_in_log(bus, kill, node, why="lost", actor="timer", done_id=done.command_id)
    records = await bus.sandboxes.read(sid)
    assert records[-1].envelope.causation_id == done.command_id


async def test_an_unclaimed_create_is_withdrawn(bus: Bus) -> None:
    cmd = sb.CreateSandbox(sandbox_id=new_sandbox_id(), template_id="base", timeout_s=60)
    assert await withdraw_create(bus, cmd, why="no room", actor="test")
    assert await _history(bus, cmd.sandbox_id) == ["SandboxRequested", "SandboxFailed"]
    # a node that pulls it later decides nothing: it failed
    assert not await withdraw_create(bus, cmd, why="no room", actor="test")


async def test_a_claimed_create_is_not_withdrawn(bus: Bus) -> None:
    cmd = sb.CreateSandbox(sandbox_id=new_sandbox_id(), template_id="base", timeout_s=60)
    await execute(bus.sandboxes, cmd)  # a node's claim came first
    assert not await withdraw_create(bus, cmd, why="no room", actor="test")
    assert await _history(bus, cmd.sandbox_id) == ["SandboxRequested"]
