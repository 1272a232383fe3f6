"""The `sandboxes` read model of a resume a node took (`SandboxResumeRequested.node_id`):
folded row by row as the projection does across batches (row → state → evolve → row), its
`node_id` is the node doing the resume while resuming — what the timer's clocks start from
(`queries.timer_start`) — and the same as the write side's fold; no new column needed."""

from __future__ import annotations

import uuid

from bus.envelope import MessageContext, decode_event, encode_event
from bus.records import RecordedEvent
from domain import sandbox as sb
from projections.folding import Row
from projections.sandboxes import sandbox_from_row, sandbox_row
from tests.unit.domain.builders import SID, at, create


def _life(*commands: sb.AnySandboxCommand) -> list[RecordedEvent]:
    """Created and paused on n1 (durably), then `commands`, as recorded events."""
    state: sb.State = None
    records: list[RecordedEvent] = []
    for cmd in (
        create(),
        sb.CompleteCreate(sandbox_id=SID, node_id="n1", at=at(1)),
        sb.PauseSandbox(sandbox_id=SID, at=at(2)),
        sb.CompletePause(sandbox_id=SID, at=at(3), snapshot_id="p1"),
        sb.RecordUpload(sandbox_id=SID, at=at(4), snapshot_id="p1", size_bytes=1),
        *commands,
    ):
        for event in sb.decide(state, cmd):
            _, data = encode_event(
                event,
                event_id=uuid.uuid4(),
                aggregate_id=SID,
                aggregate_version=len(records) + 1,
                context=MessageContext(causation_id=cmd.command_id),
            )
            env, ev = decode_event(data)
            records.append(RecordedEvent(len(records) + 1, f"x.{SID}", env, ev))
            state = sb.evolve(state, ev)
    return records


def _rows(records: list[RecordedEvent]) -> list[Row]:
    """Each row the projection writes, one event per batch (the worst case for a fold
    that starts from the stored row)."""
    rows: list[Row] = []
    for rec in records:
        state = sandbox_from_row(rows[-1]) if rows else None
        after = sb.evolve(state, rec.event)
        assert after is not None
        rows.append(sandbox_row(after, rec))
    return rows


def test_a_resuming_sandbox_is_on_the_node_doing_the_resume() -> None:
    records = _life(sb.ResumeSandbox(sandbox_id=SID, at=at(10), node_id="n2"))
    row = _rows(records)[-1]
    assert (row["status"], row["node_id"]) == ("resuming", "n2")
    written = sb.fold(r.event for r in records)
    clock = sb.fold_clock(r.event for r in records)
    assert written is not None and clock is not None
    assert row["node_id"] == written.node_id == clock.node_id


def test_a_resume_that_names_no_node_leaves_the_row_on_the_paused_node() -> None:
    row = _rows(_life(sb.ResumeSandbox(sandbox_id=SID, at=at(10))))[-1]
    assert (row["status"], row["node_id"]) == ("resuming", "n1")


def test_failed_then_resumed_elsewhere_the_rows_follow_the_log() -> None:
    records = _life(
        sb.ResumeSandbox(sandbox_id=SID, at=at(10), node_id="n2"),
        sb.CompleteResume(sandbox_id=SID, at=at(11), node_id="n2", error="n2 is gone"),
        sb.CompleteResume(sandbox_id=SID, at=at(12), node_id="n2"),  # late: moot
        sb.ResumeSandbox(sandbox_id=SID, at=at(20), node_id="n3"),
        sb.CompleteResume(sandbox_id=SID, at=at(21), node_id="n3"),
    )
    rows = _rows(records)
    assert [(r["status"], r["node_id"]) for r in rows[-4:]] == [
        ("resuming", "n2"),
        ("paused", "n1"),  # back where it was paused (n2 is gone)
        ("resuming", "n3"),
        ("running", "n3"),
    ]
    written = sb.fold(r.event for r in records)
    assert written is not None and written.node_id == rows[-1]["node_id"]
