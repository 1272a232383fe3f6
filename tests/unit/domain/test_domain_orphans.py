"""What the fleet's timer decides for sandboxes on a node that is gone: each in-flight
part of a life ends with exactly the outcome the node's own restart would have reported."""

from __future__ import annotations

import pytest

from domain import sandbox as sb
from tests.unit.domain.builders import (
    creating,
    forking,
    killing,
    paused,
    pausing,
    resuming,
    running,
    snapshotting,
)

S = sb.SandboxStatus
WHY = "node n1 is gone"


def _apply(state: sb.Sandbox) -> sb.State:
    clock = sb.clock_of(state)
    assert clock is not None
    for cmd in sb.orphan_commands(clock, WHY):
        state = sb.fold(sb.decide(state, cmd), state)  # type: ignore[assignment]
    return state


@pytest.mark.parametrize("build", [running, pausing, forking, snapshotting, killing])
def test_what_ran_there_is_killed_as_lost(build) -> None:  # type: ignore[no-untyped-def]
    after = _apply(build())
    assert after is not None and after.status is S.KILLED


def test_a_failed_sandbox_being_killed_has_its_kill_completed() -> None:
    failed = sb.fold(
        sb.decide(creating(), sb.CompleteCreate(sandbox_id="sbx1", node_id="n1", error="boom")),
        creating(),
    )
    assert failed is not None
    kill = sb.KillSandbox(sandbox_id="sbx1")
    state = sb.fold(sb.decide(failed, kill), failed)
    assert state is not None and state.status is S.KILLING
    after = _apply(state)
    assert after is not None and after.status is S.KILLED


def test_a_create_there_fails() -> None:
    after = _apply(creating())
    assert after is not None and after.status is S.FAILED and WHY in (after.failure_reason or "")


def test_a_resume_there_fails_back_to_paused() -> None:
    after = _apply(resuming())
    assert after is not None and after.status is S.PAUSED


def test_a_paused_sandbox_is_left_alone() -> None:
    clock = sb.clock_of(paused())
    assert clock is not None and sb.orphan_commands(clock, WHY) == []


def test_every_replica_decides_the_same_commands() -> None:
    clock = sb.clock_of(running())
    assert clock is not None
    ids = [c.command_id for c in sb.orphan_commands(clock, WHY)]
    assert ids == [c.command_id for c in sb.orphan_commands(clock, WHY)]
    # deciding them again on the result decides nothing (a second timer's turn)
    state = _apply(running())
    for cmd in sb.orphan_commands(clock, WHY):
        assert sb.decide(state, cmd) == []
