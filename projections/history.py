"""One aggregate's history, read from the event stream (the source of truth), for
`aenv events <sandbox>`: who did what, when, and because of which command."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from bus import EventStore

__all__ = ["HistoryLine", "format_history", "history"]

#: Payload fields never printed: secrets, and fields every line repeats.
_HIDDEN = {"envd_access_token", "sandbox_id", "at"}
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


async def history(store: EventStore[Any], aggregate_id: str) -> list[HistoryLine]:
    """Every event of one aggregate, oldest first, with who/what/when/causation."""
    lines = []
    for rec in await store.read(aggregate_id):
        env = rec.envelope
        details = {
            k: ("<redacted>" if k in _REDACTED else v)
            for k, v in env.payload.items()
            if k not in _HIDDEN
        }
        lines.append(
            HistoryLine(
                rec.seq,
                env.aggregate_version,
                env.occurred_at,
                env.type,
                env.actor,
                env.causation_id,
                env.correlation_id,
                details,
            )
        )
    return lines


def format_history(lines: list[HistoryLine]) -> str:
    """A plain-text table, one event per line."""
    out = [
        f"{'SEQ':>8}  {'REV':>4}  {'WHEN (UTC)':<26}  {'EVENT':<24}  {'ACTOR':<16}  "
        f"{'CAUSED BY':<36}  DETAILS"
    ]
    for ln in lines:
        out.append(
            f"{ln.seq:>8}  {ln.revision:>4}  {ln.at.isoformat():<26}  {ln.type:<24}  "
            f"{ln.actor or '-':<16}  {ln.causation_id or '-'!s:<36}  "
            f"{json.dumps(ln.details, sort_keys=True, default=str)}"
        )
    return "\n".join(out)
