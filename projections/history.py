"""Aggregate history, read from the event stream (the source of truth), for `aenv events`:
who did what, when, and because of which command — one aggregate's past, or events as they
are appended (`history_line` turns any recorded event into a line)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from bus import EventStore, RecordedEvent

__all__ = [
    "HistoryLine",
    "format_history",
    "format_line",
    "history",
    "history_header",
    "history_line",
]

#: Payload fields never printed: secrets, and fields every line repeats.
_HIDDEN = {"envd_access_token", "traffic_access_token", "sandbox_id", "at"}
_REDACTED = {"env_vars"}


@dataclass(frozen=True)
class HistoryLine:
    seq: int
    revision: int
    at: datetime
    type: str
    actor: str | None
    causation_id: UUID | None
    correlation_id: UUID | None
    details: dict[str, Any]
    #: The aggregate the event belongs to (a sandbox id for sandbox events).
    aggregate_id: str = ""

    def as_json(self) -> dict[str, Any]:
        """JSON-ready form (ids and times as strings) for `aenv events -o json`."""
        return {
            "seq": self.seq,
            "aggregate_id": self.aggregate_id,
            "revision": self.revision,
            "at": self.at.isoformat(),
            "type": self.type,
            "actor": self.actor,
            "causation_id": str(self.causation_id) if self.causation_id else None,
            "correlation_id": str(self.correlation_id) if self.correlation_id else None,
            "details": json.loads(json.dumps(self.details, default=str)),
        }


def history_line(rec: RecordedEvent) -> HistoryLine:
    """One recorded event as a line: secrets dropped, env var values redacted."""
    env = rec.envelope
    fields = rec.event.model_dump(mode="json")  # today's shape, older schemas upcast
    fields.update(fields.pop("spec", None) or {})  # a request's spec, read as its fields
    details = {
        k: ("<redacted>" if k in _REDACTED else v) for k, v in fields.items() if k not in _HIDDEN
    }
    return HistoryLine(
        rec.seq,
        env.aggregate_version,
        env.occurred_at,
        env.type,
        env.actor,
        env.causation_id,
        env.correlation_id,
        details,
        env.aggregate_id,
    )


async def history(store: EventStore[Any, Any], aggregate_id: str) -> list[HistoryLine]:
    """Every event of one aggregate, oldest first, with who/what/when/causation."""
    return [history_line(rec) for rec in await store.read(aggregate_id)]


#: Width of the aggregate column when several aggregates share one listing.
_ID_WIDTH = 20  # sandbox ids (domain.sandbox.values)


def history_header(with_id: bool = False) -> str:
    """Column titles of `format_line`; `with_id` adds the aggregate id after the sequence."""
    ident = f"{'ID':<{_ID_WIDTH}}  " if with_id else ""
    return (
        f"{'SEQ':>8}  {ident}{'REV':>4}  {'WHEN (UTC)':<32}  {'EVENT':<24}  {'ACTOR':<16}  "
        f"{'CAUSED BY':<36}  DETAILS"
    )


def format_line(ln: HistoryLine, with_id: bool = False) -> str:
    ident = f"{ln.aggregate_id:<{_ID_WIDTH}}  " if with_id else ""
    return (
        f"{ln.seq:>8}  {ident}{ln.revision:>4}  {ln.at.isoformat():<32}  {ln.type:<24}  "
        f"{ln.actor or '-':<16}  {ln.causation_id or '-'!s:<36}  "
        f"{json.dumps(ln.details, sort_keys=True, default=str)}"
    )


def format_history(lines: list[HistoryLine]) -> str:
    """A plain-text table, one event per line."""
    return "\n".join([history_header(), *(format_line(ln) for ln in lines)])
