"""The log audit over real decided events: answered, overtaken, unanswered, twice, stuck."""

from __future__ import annotations

import uuid

from bus.envelope import MessageContext, decode_event, encode_event
from bus.records import RecordedEvent
from domain import sandbox as sb
from projections.audit import audit
from tests.unit.domain.builders import SID, at, create


class Log:
    """Commands decided against the folded state, their events recorded as the node would:
    caused by the request a completion answers."""

    def __init__(self) -> None:
        self.records: list[RecordedEvent] = []
        self.state: sb.State = None

    def run(self, cmd: sb.AnySandboxCommand, cause: uuid.UUID | None = None) -> uuid.UUID:
        for event in sb.decide(self.state, cmd):
            self.append(event, cause or cmd.command_id)
        return cmd.command_id

    def append(self, event: sb.SandboxEvent, cause: uuid.UUID) -> None:
        _, data = encode_event(
            event,
            event_id=uuid.uuid4(),
            aggregate_id=SID,
            aggregate_version=len(self.records) + 1,
            context=MessageContext(causation_id=cause),
        )
        env, ev = decode_event(data)
        self.records.append(RecordedEvent(len(self.records) + 1, f"x.{SID}", env, ev))
        self.state = sb.evolve(self.state, ev)


def _life() -> Log:
    log = Log()
    c = log.run(create())
    log.run(sb.CompleteCreate(sandbox_id=SID, node_id="n", at=at(1)), c)
    p = log.run(sb.PauseSandbox(sandbox_id=SID, at=at(2)))
    log.run(sb.CompletePause(sandbox_id=SID, at=at(3), snapshot_id="p1"), p)
    return log


def test_a_clean_life_is_clean() -> None:
    log = _life()
    r = log.run(sb.ResumeSandbox(sandbox_id=SID, at=at(4)))
    log.run(sb.CompleteResume(sandbox_id=SID, node_id="n", at=at(5)), r)
    k = log.run(sb.KillSandbox(sandbox_id=SID, at=at(6)))
    log.run(sb.CompleteKill(sandbox_id=SID, at=at(7)), k)
    report = audit(log.records)
    assert report.clean, report.findings
    assert (report.answered, report.unanswered, report.stuck) == (4, 0, 0)
    assert report.statuses == {"killed": 1}


def test_an_unanswered_resume_is_found_and_stuck() -> None:
    log = _life()
    log.run(sb.ResumeSandbox(sandbox_id=SID, at=at(4)))
    report = audit(log.records)
    assert (report.unanswered, report.stuck) == (1, 1)
    assert {f.what for f in report.findings} == {"unanswered", "stuck"}


def test_a_pause_overtaken_by_a_kill_is_not_lost() -> None:
    log = Log()
    c = log.run(create())
    log.run(sb.CompleteCreate(sandbox_id=SID, node_id="n", at=at(1)), c)
    log.run(sb.PauseSandbox(sandbox_id=SID, at=at(2)))
    k = log.run(sb.KillSandbox(sandbox_id=SID, at=at(3)))
    log.run(sb.CompleteKill(sandbox_id=SID, at=at(4)), k)
    report = audit(log.records)
    assert report.clean and report.overtaken == 1


def test_two_outcomes_of_one_request_are_found() -> None:
    log = _life()
    r = log.run(sb.ResumeSandbox(sandbox_id=SID, at=at(4)))
    log.run(sb.CompleteResume(sandbox_id=SID, node_id="n", at=at(5), error="boom"), r)
    # a second outcome appended with the same cause, as a crash-replayed completion might
    log.append(sb.SandboxResumed(sandbox_id=SID, at=at(6), node_id="n", end_at=at(66)), r)
    report = audit(log.records)
    assert report.duplicated == 1 and not report.clean
