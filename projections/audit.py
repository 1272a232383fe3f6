"""An audit of the sandbox log: did every accepted command end exactly once?

The log is the record of an RL run's environments, so it is also how an operator (or the
reliability suite, after a crash) proves that nothing was lost or done twice: every request
event (a create, pause, resume, kill, fork or snapshot the log accepted) must be answered by
exactly one outcome it caused — or be overtaken by the sandbox's end (a kill or a failure,
after which late completions decide nothing). A sandbox left in a transitional state
(creating, pausing, …) is stuck. `audit` is a pure fold over recorded events; `read_log`
brings the events.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from nats.js import JetStreamContext

from bus import BusSettings, EventFeed, Names, RecordedEvent
from bus.subjects import AggregateKind
from domain import CommandRejected, Event
from domain import sandbox as sb
from domain.sandbox import SandboxStatus as S

__all__ = ["AuditReport", "Finding", "audit", "read_log"]

#: request event → the outcomes that answer it
OUTCOMES: dict[type[Event], tuple[type[Event], ...]] = {
    sb.SandboxRequested: (sb.SandboxCreated, sb.SandboxFailed),
    sb.SandboxPauseRequested: (sb.SandboxPaused, sb.SandboxFailed),
    sb.SandboxResumeRequested: (sb.SandboxResumed, sb.SandboxResumeFailed),
    sb.SandboxKillRequested: (sb.SandboxKilled,),
    sb.SandboxForkRequested: (sb.SandboxForked,),
    sb.SnapshotRequested: (sb.SnapshotTaken, sb.SnapshotFailed),
}
#: a sandbox's end: requests still open then are overtaken, not lost
ENDS = (sb.SandboxKilled, sb.SandboxFailed)
SETTLED = frozenset({S.RUNNING, S.PAUSED, S.KILLED, S.FAILED})


@dataclass(frozen=True)
class Finding:
    sandbox_id: str
    what: str  # "unanswered", "answered twice", "stuck"
    detail: str


@dataclass
class AuditReport:
    sandboxes: int = 0
    events: int = 0
    #: accepted requests by kind (event type name)
    requests: Counter[str] = field(default_factory=Counter)
    answered: int = 0
    #: requests whose sandbox ended (killed, failed) before they were answered
    overtaken: int = 0
    unanswered: int = 0
    duplicated: int = 0
    stuck: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        reqs = ", ".join(f"{k} {v}" for k, v in sorted(self.requests.items()))
        states = ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items()))
        return (
            f"{self.sandboxes} sandboxes, {self.events} events; requests: {reqs}; "
            f"answered {self.answered}, overtaken by a kill {self.overtaken}, "
            f"unanswered {self.unanswered}, answered twice {self.duplicated}; "
            f"stuck {self.stuck}; states: {states}"
        )


def audit(records: Iterable[RecordedEvent]) -> AuditReport:
    """Fold sandbox events (in stream order) into the audit: `unanswered` counts requests
    neither answered nor overtaken — for a live stack, also those still in flight."""
    report = AuditReport()
    by_sandbox: dict[str, list[RecordedEvent]] = defaultdict(list)
    for rec in records:
        if isinstance(rec.event, sb.SandboxEvent | CommandRejected):
            by_sandbox[rec.envelope.aggregate_id].append(rec)
    for sid, recs in by_sandbox.items():
        report.sandboxes += 1
        report.events += len(recs)
        _audit_one(sid, recs, report)
    return report


def _audit_one(sid: str, recs: list[RecordedEvent], report: AuditReport) -> None:
    state = sb.fold(r.event for r in recs)
    status = state.status if state is not None else None
    report.statuses[status.value if status is not None else "none"] += 1
    if status is not None and status not in SETTLED:
        report.stuck += 1
        report.findings.append(Finding(sid, "stuck", f"in {status.value}"))
    ended_at = next((i for i, r in enumerate(recs) if isinstance(r.event, ENDS)), None)
    for i, rec in enumerate(recs):
        answers = OUTCOMES.get(type(rec.event))
        if answers is None:
            continue
        kind = type(rec.event).__name__
        report.requests[kind] += 1
        cause = rec.envelope.causation_id
        n = sum(
            1
            for r in recs[i + 1 :]
            if r.envelope.causation_id == cause and isinstance(r.event, (*answers, CommandRejected))
        )
        if n == 1:
            report.answered += 1
        elif n > 1:
            report.duplicated += 1
            report.findings.append(Finding(sid, "answered twice", f"{kind} {cause}: {n} outcomes"))
        elif ended_at is not None and ended_at > i:
            report.overtaken += 1
        else:
            report.unanswered += 1
            report.findings.append(Finding(sid, "unanswered", f"{kind} {cause} (seq {rec.seq})"))


async def read_log(js: JetStreamContext, settings: BusSettings) -> list[RecordedEvent]:
    """Every sandbox event stored so far, in stream order."""
    names = Names(settings.bus_prefix)
    last = (await js.stream_info(names.event_stream)).state.last_seq
    out: list[RecordedEvent] = []
    if last == 0:
        return out
    async with EventFeed(js, settings, names.events_of_kind(AggregateKind.SANDBOX)) as feed:
        while not out or out[-1].seq < last:
            batch = await feed.next_batch(timeout=5.0)
            if not batch:
                if feed.caught_up():
                    break
                continue
            out.extend(batch)
    return out
