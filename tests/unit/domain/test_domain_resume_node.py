"""A resume names the node that takes it (`ResumeSandbox.node_id`, set by that node before
it appends the request): while resuming, the sandbox is on that node — in the aggregate, in
the timer's clock — so the loss of the node it was paused on never fails a resume another
node is doing (the two-node race where the timer failed node A's take-over because node B,
where the sandbox had been paused, went silent)."""

from __future__ import annotations

import pytest

from domain import Conflict
from domain import sandbox as sb
from tests.unit.domain.builders import SID, at, paused, step
from workers.timer import Timer

S = sb.SandboxStatus


def _history(*commands: sb.AnySandboxCommand) -> list[object]:
    """Events of a sandbox created and paused on n1, then of `commands` in turn."""
    state: sb.State = None
    events: list[object] = []
    for cmd in (
        sb.CreateSandbox(sandbox_id=SID, template_id="base", at=at(0), timeout_s=60),
        sb.CompleteCreate(sandbox_id=SID, node_id="n1", at=at(1)),
        sb.PauseSandbox(sandbox_id=SID, at=at(20)),
        sb.CompletePause(sandbox_id=SID, at=at(21), snapshot_id="p1"),
        sb.RecordUpload(sandbox_id=SID, at=at(22), snapshot_id="p1", size_bytes=1),
        *commands,
    ):
        new = sb.decide(state, cmd)
        events += new
        state = sb.fold(new, state)
    return events


def _taken_by(node: str | None) -> sb.ResumeSandbox:
    return sb.ResumeSandbox(sandbox_id=SID, at=at(100), node_id=node)


def test_the_resume_request_records_the_node_that_took_it() -> None:
    (event,) = sb.decide(paused(), _taken_by("n2"))
    assert isinstance(event, sb.SandboxResumeRequested) and event.node_id == "n2"
    history = _history(_taken_by("n2"))
    state = sb.fold(history)  # type: ignore[arg-type]
    assert state is not None and (state.status, state.node_id) == (S.RESUMING, "n2")
    clock = sb.fold_clock(history)  # type: ignore[arg-type]
    assert clock is not None and (clock.status, clock.node_id) == (S.RESUMING, "n2")
    assert sb.clock_of(state) == clock


def test_a_request_that_names_no_node_leaves_it_where_it_was_paused() -> None:
    """Histories from before nodes named themselves (and a client's command as published)."""
    history = _history(_taken_by(None))
    state, clock = sb.fold(history), sb.fold_clock(history)  # type: ignore[arg-type]
    assert state is not None and state.node_id == "n1"
    assert clock is not None and clock.node_id == "n1" and sb.clock_of(state) == clock
    old = sb.SandboxResumeRequested.model_validate(
        {
            "sandbox_id": SID,
            "at": at(5).isoformat(),
            "command_id": _taken_by(None).command_id,
            "timeout_s": None,
        }
    )
    assert old.node_id is None


def test_the_loss_of_the_paused_node_does_not_end_a_resume_another_node_does() -> None:
    timer = Timer(bus=None)  # type: ignore[arg-type]  # on_node never touches the bus
    for e in _history(_taken_by("n2")):
        timer.fold(SID, e)  # type: ignore[arg-type]
    assert timer.on_node("n1") == []  # n1 silent: nothing of it under way
    (clock,) = timer.on_node("n2")
    # n2 gone: its resume fails back to paused, as the node's own failure would
    (done,) = sb.orphan_commands(clock, "node n2 is gone")
    assert isinstance(done, sb.CompleteResume) and done.node_id == "n2"


def test_the_resume_completes_on_the_node_that_took_it() -> None:
    history = _history(_taken_by("n2"), sb.CompleteResume(sandbox_id=SID, node_id="n2", at=at(101)))
    state = sb.fold(history)  # type: ignore[arg-type]
    assert state is not None and (state.status, state.node_id) == (S.RUNNING, "n2")


def test_a_late_completion_of_a_resume_failed_meanwhile_decides_nothing() -> None:
    """The timer failed the resume (its node taken for gone) before the node reported it
    done: the report is moot (the node drops its VM: `failed_meanwhile`), not a conflict."""
    failed = sb.fold(
        _history(
            _taken_by("n2"),
            sb.CompleteResume(sandbox_id=SID, node_id="n2", at=at(110), error="n2 is gone"),
        )  # type: ignore[arg-type]
    )
    assert failed is not None and failed.status is S.PAUSED
    assert failed.paused_snapshot_id == "p1" and failed.resumable_anywhere
    late = sb.CompleteResume(sandbox_id=SID, node_id="n2", at=at(111))
    assert sb.decide(failed, late) == []
    # and it can be resumed again, anywhere (its capture is in the repository)
    again = step(failed, sb.ResumeSandbox(sandbox_id=SID, at=at(120), node_id="n3"))
    assert again is not None and (again.status, again.node_id) == (S.RESUMING, "n3")


def test_a_lagging_timer_never_fails_a_resume_another_node_took_meanwhile() -> None:
    """The timer decides on its clock (the resume on n1, n1 gone) while the log has moved
    on: that resume failed, and a new one is under way on n2. Its failure is moot there."""
    stale = sb.fold_clock(_history(_taken_by("n1")))  # type: ignore[arg-type]
    assert stale is not None and stale.node_id == "n1"
    (end,) = sb.orphan_commands(stale, "node n1 is gone")
    assert isinstance(end, sb.CompleteResume) and end.lost_node == "n1"
    now = sb.fold(
        _history(
            _taken_by("n1"),
            sb.CompleteResume(sandbox_id=SID, node_id="n1", at=at(101), error="no room"),
            sb.ResumeSandbox(sandbox_id=SID, at=at(102), node_id="n2"),
        )  # type: ignore[arg-type]
    )
    assert now is not None and (now.status, now.node_id) == (S.RESUMING, "n2")
    assert sb.decide(now, end) == []
    # on the node it names, the same command fails the resume back to paused
    on_n1 = sb.fold(_history(_taken_by("n1")))  # type: ignore[arg-type]
    assert [type(e) for e in sb.decide(on_n1, end)] == [sb.SandboxResumeFailed]


def test_a_failed_resume_leaves_the_sandbox_on_the_node_it_was_paused_on() -> None:
    """n2 tried and refused (its base holds other bytes; or it was gone): the sandbox goes
    back to n1, where its bytes are, so the next resume is not sent to n2 again."""
    history = _history(
        _taken_by("n2"),
        sb.CompleteResume(sandbox_id=SID, node_id="n2", at=at(101), error="other bytes"),
    )
    (failed,) = [e for e in history if isinstance(e, sb.SandboxResumeFailed)]
    assert failed.node_id == "n1"
    state, clock = sb.fold(history), sb.fold_clock(history)  # type: ignore[arg-type]
    assert state is not None and (state.status, state.node_id) == (S.PAUSED, "n1")
    assert state.paused_on is None
    assert clock is not None and (clock.status, clock.node_id) == (S.PAUSED, "n1")
    assert sb.clock_of(state) == clock
    # a failure from before resumes named their node leaves it where the request left it
    old = sb.SandboxResumeFailed.model_validate(
        {"sandbox_id": SID, "at": at(5).isoformat(), "reason": "x"}
    )
    assert old.node_id is None
    resuming = sb.fold(_history(_taken_by("n2")))  # type: ignore[arg-type]
    after = sb.evolve(resuming, old)
    assert after is not None and (after.status, after.node_id) == (S.PAUSED, "n2")


def test_a_second_request_to_resume_a_resuming_sandbox_is_refused_not_joined() -> None:
    """Two clients resume at once: the first request's node does it and answers it; the
    second is a conflict its caller waits out (`api.resume`), never a second resume of the
    same capture with a second answer."""
    first, second = _taken_by("n2"), _taken_by("n2")
    state = sb.fold(_history(first))  # type: ignore[arg-type]
    assert state is not None and state.resuming_command == first.command_id
    assert sb.decide(state, first) == []  # a redelivery of the first decides nothing
    with pytest.raises(Conflict, match="already being resumed"):
        sb.decide(state, second)


def test_the_resume_under_way_is_the_latest_requests() -> None:
    """Paused and resumed again: the log's resume is the second request's, whose id a
    redelivery of the first (answered long ago) does not carry (`after_request`)."""
    first, second = _taken_by("n2"), _taken_by("n2")
    history = _history(
        first,
        sb.CompleteResume(sandbox_id=SID, node_id="n2", at=at(101)),
        sb.PauseSandbox(sandbox_id=SID, at=at(110)),
        sb.CompletePause(sandbox_id=SID, at=at(111), snapshot_id="p2"),
        second,
    )
    state = sb.fold(history)  # type: ignore[arg-type]
    assert state is not None and state.status is S.RESUMING
    assert state.resuming_command == second.command_id
    assert sb.decide(state, first) == []  # seen: decides nothing


def test_a_resume_redelivered_after_many_cycles_decides_nothing() -> None:
    """Redelivered after its node's ack was lost in a NATS outage, while the sandbox went
    through pause and resume cycles by other requests: still the same request, answered
    once (the window of 16 it fell out of made it a second resume, answered twice)."""
    first = _taken_by("n2")
    cmds: list[sb.AnySandboxCommand] = [
        first,
        sb.CompleteResume(sandbox_id=SID, node_id="n2", at=at(101)),
    ]
    for i in range(40):  # 120 accepted commands: pause, resume and a timeout, 40 times
        cmds += [
            sb.PauseSandbox(sandbox_id=SID, at=at(110 + i)),
            sb.CompletePause(sandbox_id=SID, at=at(110 + i), snapshot_id=f"p{i}"),
            sb.ResumeSandbox(sandbox_id=SID, at=at(110 + i), node_id="n2"),
            sb.CompleteResume(sandbox_id=SID, node_id="n2", at=at(110 + i)),
            sb.SetSandboxTimeout(sandbox_id=SID, at=at(110 + i), timeout_s=100),
        ]
    state = sb.fold(_history(*cmds))  # type: ignore[arg-type]
    assert state is not None and state.status is S.RUNNING
    assert sb.decide(state, first) == []
