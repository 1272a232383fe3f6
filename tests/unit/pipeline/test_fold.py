"""The client's audit fold agrees with the domain's `evolve` on every fact it keeps, over
histories the domain's own `decide` writes, read back through the wire."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from aenv_pipeline.audit import compare
from aenv_pipeline.events import Event, fold
from aenv_pipeline.wire import EventEnvelope
from bus.envelope import MessageContext, derive_event_id, encode_event
from domain import sandbox as sb

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SID = "s1"


def _create() -> sb.CreateSandbox:
    return sb.CreateSandbox(
        sandbox_id=SID, template_id="base", team_id="t1", metadata={"run": "r"}, memory_mb=1024
    )


#: a command, or how to make one from the state so far (a fork's children)
Step = sb.AnySandboxCommand | Callable[[sb.Sandbox], sb.AnySandboxCommand]

SCENARIOS: dict[str, list[Step]] = {
    "created": [_create(), sb.CompleteCreate(sandbox_id=SID, node_id="n1")],
    "failed": [_create(), sb.CompleteCreate(sandbox_id=SID, node_id="n1", error="boom")],
    "paused, resumed elsewhere, timeout set": [
        _create(),
        sb.CompleteCreate(sandbox_id=SID, node_id="n1"),
        sb.PauseSandbox(sandbox_id=SID),
        sb.CompletePause(sandbox_id=SID, snapshot_id="c1"),
        sb.ResumeSandbox(sandbox_id=SID, at=T0 + timedelta(minutes=5)),
        sb.CompleteResume(sandbox_id=SID, node_id="n2"),
        sb.SetSandboxTimeout(sandbox_id=SID, timeout_s=900),
    ],
    "forked, snapshotted, killed": [
        _create(),
        sb.CompleteCreate(sandbox_id=SID, node_id="n1"),
        sb.ForkSandbox(sandbox_id=SID, count=2),
        lambda s: sb.CompleteFork(
            sandbox_id=SID,
            children=tuple(sb.ForkChildResult(sandbox_id=c) for c in s.pending_children),
        ),
        sb.SnapshotSandbox(sandbox_id=SID, snapshot_id="x:1"),
        sb.CompleteSnapshot(sandbox_id=SID, snapshot_id="x:1", node_id="n1"),
        sb.KillSandbox(sandbox_id=SID),
        sb.CompleteKill(sandbox_id=SID),
    ],
}


def _history(steps: list[Step]) -> tuple[list[sb.State], list[Event]]:
    """Each state the domain folds to, and the events as the client reads them."""
    state: sb.State = None
    states: list[sb.State] = []
    read: list[Event] = []
    for step in steps:
        command = step(state) if callable(step) and state is not None else step
        assert not callable(command)
        for i, event in enumerate(sb.decide(state, command)):
            state = sb.evolve(state, event)
            version = len(read) + 1
            _, data = encode_event(
                event,
                event_id=derive_event_id(command.command_id, SID, i),
                aggregate_id=SID,
                aggregate_version=version,
                context=MessageContext(causation_id=command.command_id),
            )
            read.append(
                Event(version, f"aenv.evt.sandbox.{SID}", EventEnvelope.model_validate_json(data))
            )
            states.append(state)
    return states, read


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_client_folds_as_the_domain_does(name: str) -> None:
    states, events = _history(SCENARIOS[name])
    assert events, name
    for n, state in enumerate(states, start=1):
        view = fold(events[:n])
        assert state is not None and view is not None
        got = (view.status, view.node_id, view.end_at, view.metadata, view.memory_mb)
        want = (state.status.value, state.node_id, state.end_at, state.metadata, state.memory_mb)
        assert got == want, f"{name}: after {events[n - 1].type}"
        assert view.state == sb.public_state(state.status)
        assert view.version == n and view.team_id == "t1"


def test_an_audit_names_what_differs() -> None:
    _, events = _history(SCENARIOS["created"])
    view = fold(events)
    assert view is not None and view.end_at is not None
    body = {
        "sandboxID": SID,
        "state": "running",
        "metadata": {"run": "r"},
        "cpuCount": 2,
        "memoryMB": 1024,
        "endAt": view.end_at.isoformat().replace("+00:00", "Z"),
    }
    assert compare(view, body) == []
    wrong = compare(view, {**body, "state": "paused", "metadata": {}})
    assert [m.field for m in wrong] == ["state", "metadata"]
    assert [m.field for m in compare(view, None)] == ["state"]
    _, killed = _history(SCENARIOS["forked, snapshotted, killed"])
    assert compare(fold(killed), None) == []  # killed: the API answers 404, as it should
