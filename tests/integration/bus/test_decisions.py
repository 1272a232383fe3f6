"""`apply` decides on a state it already holds before reading the stream: these tests give
it a stale one — another writer (a second process, a second store here) appended since —
and check that the decision is the one the real history calls for."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bus import Bus
from bus.decisions import execute
from bus.store import EventStore, SandboxStore
from domain import sandbox as sb
from domain.aggregates import SANDBOX
from domain.errors import Conflict
from domain.sandbox.values import new_sandbox_id

T0 = datetime(2026, 1, 1, tzinfo=UTC)
S = sb.SandboxStatus


def _other_process(bus: Bus) -> SandboxStore:
    return EventStore(bus.js, bus.publisher, bus.settings, SANDBOX)


async def _running(store: SandboxStore) -> str:
    sid = new_sandbox_id()
    await execute(store, sb.CreateSandbox(sandbox_id=sid, template_id="base", at=T0, timeout_s=60))
    await execute(store, sb.CompleteCreate(sandbox_id=sid, node_id="n1", at=T0))
    return sid


async def test_a_stale_guess_that_decides_events_is_decided_again(bus: Bus) -> None:
    mine, theirs = bus.sandboxes, _other_process(bus)
    sid = await _running(mine)
    await execute(theirs, sb.PauseSandbox(sandbox_id=sid, at=T0))  # `mine` did not see it
    assert mine.cached(sid)[0].status is S.RUNNING  # type: ignore[index,union-attr]
    state, _, events = await execute(mine, sb.KillSandbox(sandbox_id=sid, at=T0))
    assert [type(e) for e in events] == [sb.SandboxKillRequested]
    assert state is not None and state.status is S.KILLING
    history = [type(r.event).__name__ for r in await mine.read(sid)]
    assert history[-2:] == ["SandboxPauseRequested", "SandboxKillRequested"]


async def test_a_stale_guess_that_decides_nothing_is_checked_against_the_log(bus: Bus) -> None:
    mine, theirs = bus.sandboxes, _other_process(bus)
    sid = await _running(mine)
    await execute(theirs, sb.PauseSandbox(sandbox_id=sid, at=T0))
    await execute(theirs, sb.CompletePause(sandbox_id=sid, snapshot_id="s1", at=T0))
    # on the stale RUNNING state a resume is a no-op; the log says paused: it must resume
    state, _, events = await execute(mine, sb.ResumeSandbox(sandbox_id=sid, at=T0))
    assert [type(e) for e in events] == [sb.SandboxResumeRequested]
    assert state is not None and state.status is S.RESUMING


async def test_a_stale_guess_that_rejects_is_checked_against_the_log(bus: Bus) -> None:
    mine, theirs = bus.sandboxes, _other_process(bus)
    sid = await _running(mine)
    await execute(mine, sb.PauseSandbox(sandbox_id=sid, at=T0))  # mine: PAUSING → fork refused
    await execute(theirs, sb.CompletePause(sandbox_id=sid, snapshot_id="s1", at=T0))
    await execute(theirs, sb.ResumeSandbox(sandbox_id=sid, at=T0))
    await execute(theirs, sb.CompleteResume(sandbox_id=sid, node_id="n1", at=T0))
    state, _, events = await execute(mine, sb.ForkSandbox(sandbox_id=sid, at=T0, count=2))
    assert state is not None and state.status is S.FORKING and events


async def test_a_real_rejection_still_raises(bus: Bus) -> None:
    sid = await _running(bus.sandboxes)
    await execute(bus.sandboxes, sb.PauseSandbox(sandbox_id=sid, at=T0))
    with pytest.raises(Conflict):
        await execute(bus.sandboxes, sb.ForkSandbox(sandbox_id=sid, at=T0, count=2))


async def test_a_redelivered_create_guessed_new_appends_nothing(bus: Bus) -> None:
    sid = new_sandbox_id()
    create = sb.CreateSandbox(sandbox_id=sid, template_id="base", at=T0, timeout_s=60)
    await execute(bus.sandboxes, create)
    state, _, events = await execute(_other_process(bus), create)  # nothing cached: guesses NEW
    assert events == [] and state is not None and state.status is S.CREATING
    assert len(await bus.sandboxes.read(sid)) == 1


async def test_a_create_redelivered_after_the_sandbox_moved_on_sees_where_it_is(bus: Bus) -> None:
    """Another process gets the create again (its node died before the ack) after the
    sandbox ran: JetStream de-duplicates the create's event without checking its position,
    so believing the append would say "creating" and start a second VM. It reloads."""
    sid = new_sandbox_id()
    create = sb.CreateSandbox(sandbox_id=sid, template_id="base", at=T0, timeout_s=60)
    await execute(bus.sandboxes, create)
    await execute(bus.sandboxes, sb.CompleteCreate(sandbox_id=sid, node_id="n1", at=T0))
    state, version, events = await execute(_other_process(bus), create)
    assert events == [] and state is not None and state.status is S.RUNNING
    assert version.revision == 2
