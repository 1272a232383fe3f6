"""The timer's view of a sandbox (`Clock`) folds the same histories as the sandbox: for
any history `decide` produces, `clock_of(fold(h)) == fold_clock(h)`. Histories are random
walks of commands and node completions (successes and failures) that `decide` accepts."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from domain import DomainError, Event
from domain import sandbox as sb
from tests.unit.domain.builders import SID, create

S = sb.SandboxStatus

#: each step: what to ask of the sandbox in `state` at time `t`
Step = Callable[[sb.Sandbox, float], sb.AnySandboxCommand]


def _at(t: float):  # type: ignore[no-untyped-def]
    from tests.unit.domain.builders import at

    return at(t)


STEPS: list[Step] = [
    lambda s, t: sb.CompleteCreate(sandbox_id=SID, node_id="n2", at=_at(t)),
    lambda s, t: sb.CompleteCreate(sandbox_id=SID, node_id="n2", at=_at(t), error="boom"),
    lambda s, t: sb.PauseSandbox(sandbox_id=SID, at=_at(t)),
    lambda s, t: sb.CompletePause(sandbox_id=SID, at=_at(t), snapshot_id=f"p{t}"),
    lambda s, t: sb.ResumeSandbox(sandbox_id=SID, at=_at(t)),
    lambda s, t: sb.ResumeSandbox(sandbox_id=SID, at=_at(t), timeout_s=30),
    lambda s, t: sb.CompleteResume(sandbox_id=SID, node_id="n3", at=_at(t)),
    lambda s, t: sb.CompleteResume(sandbox_id=SID, node_id="n3", at=_at(t), error="no"),
    lambda s, t: sb.SetSandboxTimeout(sandbox_id=SID, at=_at(t), timeout_s=90),
    lambda s, t: sb.ForkSandbox(sandbox_id=SID, at=_at(t), count=2, timeout_s=30),
    lambda s, t: sb.CompleteFork(
        sandbox_id=SID,
        at=_at(t),
        children=tuple(sb.ForkChildResult(sandbox_id=c, error=None) for c in s.pending_children),
    ),
    lambda s, t: sb.SnapshotSandbox(sandbox_id=SID, at=_at(t), snapshot_id=f"s{t}"),
    lambda s, t: sb.CompleteSnapshot(
        sandbox_id=SID, at=_at(t), snapshot_id=s.pending_snapshot_id or "x", node_id="n2"
    ),
    lambda s, t: sb.RecordUpload(sandbox_id=SID, at=_at(t), snapshot_id=f"p{t}", size_bytes=1),
    lambda s, t: sb.KillSandbox(sandbox_id=SID, at=_at(t)),
    lambda s, t: sb.CompleteKill(sandbox_id=SID, at=_at(t)),
    # (appended: tests name steps by index) a resume a node took, naming itself
    lambda s, t: sb.ResumeSandbox(sandbox_id=SID, at=_at(t), node_id="n4"),
]


def _walk(choices: list[int], on_timeout: str) -> list[Event]:
    state: sb.State = None
    events: list[Event] = list(
        sb.decide(None, create(lifecycle=sb.Lifecycle(on_timeout=on_timeout)))
    )  # type: ignore[arg-type]
    state = sb.fold(events)
    for i, c in enumerate(choices):
        assert state is not None
        try:
            new = sb.decide(state, STEPS[c](state, float(i + 1)))
        except DomainError:
            continue
        events += new
        state = sb.fold(new, state)
    return events


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, len(STEPS) - 1), max_size=40), st.sampled_from(["pause", "kill"]))
def test_the_clock_folds_what_the_sandbox_folds(choices: list[int], on_timeout: str) -> None:
    history = _walk(choices, on_timeout)
    state = sb.fold(history)
    assert state is not None
    assert sb.clock_of(state) == sb.fold_clock(history)
    # and every prefix: the timer acts at any point of a life
    for n in range(len(history)):
        prefix = sb.fold(history[: n + 1])
        assert prefix is not None
        assert sb.clock_of(prefix) == sb.fold_clock(history[: n + 1])


def test_the_clock_decides_expiry_as_the_state_does() -> None:
    history = _walk([0], "pause")  # created, running
    state = sb.fold(history)
    clock = sb.fold_clock(history)
    assert state is not None and clock is not None and state.end_at is not None
    late = state.end_at + timedelta(seconds=1)
    assert sb.expiry_command(state, late) == sb.expiry_command(clock, late) is not None


def test_an_ended_sandbox_is_forgotten() -> None:
    history = _walk([0, 14, 15], "kill")  # created, kill, killed
    assert sb.fold(history) is not None and sb.fold_clock(history) is None
