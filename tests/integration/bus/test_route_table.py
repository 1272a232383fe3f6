"""The proxy's route table against real JetStream: a node writes a route beside the event
that announces its sandbox running, so a request may find the sandbox running before its
route arrived — it must wait for it, and give up soon when none is coming."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
import pytest_asyncio

from bus import Bus
from bus.decisions import execute
from bus.routes import Route
from domain import sandbox as sb
from domain.sandbox.values import new_sandbox_id
from shared.proxy import RouteTable, SandboxUnavailable
from shared.proxy import routes as routes_mod

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest_asyncio.fixture
async def table(bus: Bus) -> AsyncIterator[RouteTable]:
    t = await RouteTable.open(bus)
    try:
        yield t
    finally:
        await t.close()


async def _sandbox(bus: Bus, *, running: bool) -> str:
    sid = new_sandbox_id()
    await execute(
        bus.sandboxes, sb.CreateSandbox(sandbox_id=sid, template_id="base", at=T0, timeout_s=60)
    )
    if running:
        await execute(bus.sandboxes, sb.CompleteCreate(sandbox_id=sid, node_id="n1", at=T0))
    return sid


async def test_a_running_sandbox_waits_for_its_late_route(bus: Bus, table: RouteTable) -> None:
    sid = await _sandbox(bus, running=True)
    lookup = asyncio.create_task(table.resolve(sid, 49983))
    await asyncio.sleep(0.2)
    assert not lookup.done()  # no 502 for a sandbox that runs
    await table.book.put(sid, Route(node_id="n1", address="10.9.0.2"))
    upstream = await asyncio.wait_for(lookup, 2.0)
    assert (upstream.host, upstream.port) == ("10.9.0.2", 49983)


async def test_a_creating_sandbox_waits_until_it_runs(bus: Bus, table: RouteTable) -> None:
    sid = await _sandbox(bus, running=False)
    lookup = asyncio.create_task(table.resolve(sid, 8080))
    await asyncio.sleep(0.7)  # past a poll of the state: still creating, keep waiting
    assert not lookup.done()
    await execute(bus.sandboxes, sb.CompleteCreate(sandbox_id=sid, node_id="n1", at=T0))
    await table.book.put(sid, Route(node_id="n1", address="10.9.0.3"))
    assert (await asyncio.wait_for(lookup, 2.0)).host == "10.9.0.3"


async def test_no_route_for_a_running_sandbox_is_a_502_after_the_grace(
    bus: Bus, table: RouteTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(routes_mod, "ROUTE_GRACE_S", 0.3)
    sid = await _sandbox(bus, running=True)
    with pytest.raises(SandboxUnavailable):
        await asyncio.wait_for(table.resolve(sid, 49983), 2.0)


async def test_a_create_that_fails_ends_the_wait(bus: Bus, table: RouteTable) -> None:
    sid = await _sandbox(bus, running=False)
    lookup = asyncio.create_task(table.resolve(sid, 49983))
    await asyncio.sleep(0.1)
    await execute(
        bus.sandboxes, sb.CompleteCreate(sandbox_id=sid, node_id="n1", at=T0, error="boom")
    )
    with pytest.raises(SandboxUnavailable):
        await asyncio.wait_for(lookup, 2.0)  # not the 60 s a resume may take


async def test_an_unknown_sandbox_is_a_502_at_once(bus: Bus, table: RouteTable) -> None:
    with pytest.raises(SandboxUnavailable):
        await asyncio.wait_for(table.resolve(new_sandbox_id(), 49983), 0.5)


async def test_a_table_closed_right_after_it_opened_closes(bus: Bus) -> None:
    """Closing cancels the watch while it may still be setting up, inside a nats-py request
    whose Python 3.11 `wait_for` can swallow the cancel: close must still return (it used
    to wait forever, one open/close in ten or so)."""
    for i in range(60):
        table = await RouteTable.open(bus)
        await asyncio.sleep(i % 12 * 0.001)  # sweeps the watch's set-up requests
        closing = asyncio.create_task(table.close())
        done, _ = await asyncio.wait({closing}, timeout=5.0)
        assert closing in done, "RouteTable.close() hung"


async def _paused(bus: Bus, *, auto_resume: bool) -> str:
    sid = new_sandbox_id()
    life = sb.Lifecycle(on_timeout="pause", auto_resume=auto_resume)
    for cmd in (
        sb.CreateSandbox(sandbox_id=sid, template_id="base", at=T0, timeout_s=60, lifecycle=life),
        sb.CompleteCreate(sandbox_id=sid, node_id="n1", at=T0),
        sb.PauseSandbox(sandbox_id=sid, at=T0),
        sb.CompletePause(sandbox_id=sid, snapshot_id=f"{sid}-p1", at=T0),
    ):
        await execute(bus.sandboxes, cmd)
    return sid


async def test_auto_resume_goes_through_the_policy_then_waits_for_the_route(bus: Bus) -> None:
    """The table does not decide where a resume goes: it calls the policy it was handed
    (the API's, the same as its resume route's) and then waits for the node's route."""
    asked: list[str] = []

    async def policy(state: sb.Sandbox) -> None:
        asked.append(state.sandbox_id)
        await execute(bus.sandboxes, sb.ResumeSandbox(sandbox_id=state.sandbox_id, at=T0))
        await execute(
            bus.sandboxes, sb.CompleteResume(sandbox_id=state.sandbox_id, node_id="n2", at=T0)
        )
        await table.book.put(state.sandbox_id, Route(node_id="n2", address="10.9.0.7"))

    table = await RouteTable.open(bus, resume=policy)
    try:
        sid = await _paused(bus, auto_resume=True)
        first, second = await asyncio.wait_for(
            asyncio.gather(table.resolve(sid, 49983), table.resolve(sid, 8080)), 5.0
        )
        assert (first.host, second.host) == ("10.9.0.7", "10.9.0.7")
        assert asked == [sid]  # concurrent requests share one resume
    finally:
        await table.close()


async def test_a_paused_sandbox_is_a_502_without_auto_resume_or_when_the_policy_fails(
    bus: Bus,
) -> None:
    async def failing(state: sb.Sandbox) -> None:
        raise RuntimeError("node gone and capture not durable")

    table = await RouteTable.open(bus, resume=failing)
    try:
        for sid in (await _paused(bus, auto_resume=False), await _paused(bus, auto_resume=True)):
            with pytest.raises(SandboxUnavailable):
                await asyncio.wait_for(table.resolve(sid, 49983), 2.0)
    finally:
        await table.close()
