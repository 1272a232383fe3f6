"""A sandbox's life as the console's timeline: the events of its log (`projections.history`,
what `aenv events` prints), each with who asked, what caused it, and — for an outcome — how
long after its request it came.

A request and its outcome share their causation (the command's id: the node decides the
completion in the command's context), so the time between the first event of a causation
and each later one is how long the operation took: a pause's `SandboxPauseRequested` →
`SandboxPaused`, a create's `SandboxRequested` → `SandboxCreated`. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from projections import HistoryLine

__all__ = ["Segment", "Step", "actor_label", "lifeline", "steps", "summary"]

#: Details worth a glance, in the order they are shown; the rest stay in the full record.
_SHOWN = (
    "template_id",
    "node_id",
    "operation",
    "reason",
    "error",
    "code",
    "timeout_s",
    "remaining_s",
    "memory",
    "keep_memory",
    "warm",
    "snapshot_id",
    "size_bytes",
    "used_bytes",
    "total_bytes",
    "child_ids",
    "children",
    "cpu_count",
    "memory_mb",
    "forked_from",
)
_SUMMARY_MAX = 160


@dataclass(frozen=True)
class Step:
    seq: int
    revision: int
    at: datetime
    type: str
    actor: str
    #: the command this event answers (short form; the full id is in `record`)
    causation: str
    #: seconds since the first event of the same causation (None: it is that first event)
    took_s: float | None
    #: request | done | failed — a request opens an operation, the others end it
    kind: str
    summary: str
    #: every detail the log keeps of it (secrets dropped, env vars redacted), as JSON
    record: str


def actor_label(actor: str | None) -> str:
    """Who caused it: an API key by its id, a node, or the platform itself (the timer)."""
    if not actor:
        return "aenv"
    if ":" in actor:  # node:<id>, timer:…
        return actor
    return f"key {actor}"


def _kind(event_type: str) -> str:
    if event_type.endswith("Failed") or event_type == "CommandRejected":
        return "failed"
    if event_type.endswith("Requested"):
        return "request"
    return "done"


def _value(v: Any) -> str:
    if isinstance(v, list | tuple):
        items = [c.get("sandbox_id", c) if isinstance(c, dict) else c for c in v]
        return ",".join(str(i) for i in items)
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


def summary(details: dict[str, Any]) -> str:
    """The details that tell this event apart, `key=value`, cut to one line."""
    parts = [f"{k}={_value(details[k])}" for k in _SHOWN if details.get(k) not in (None, "")]
    text = "  ".join(parts)
    return text if len(text) <= _SUMMARY_MAX else text[: _SUMMARY_MAX - 1] + "…"


def steps(lines: list[HistoryLine]) -> list[Step]:
    """The timeline of one aggregate's history lines, oldest first."""
    opened: dict[str, datetime] = {}
    out: list[Step] = []
    for ln in lines:
        cause = str(ln.causation_id) if ln.causation_id else ""
        took: float | None = None
        if cause and cause in opened:
            took = (ln.at - opened[cause]).total_seconds()
        elif cause:
            opened[cause] = ln.at
        out.append(
            Step(
                seq=ln.seq,
                revision=ln.revision,
                at=ln.at,
                type=ln.type,
                actor=actor_label(ln.actor),
                causation=cause[:8],
                took_s=took,
                kind=_kind(ln.type),
                summary=summary(ln.details),
                record=json.dumps(ln.as_json(), indent=1, sort_keys=True),
            )
        )
    return out


@dataclass(frozen=True)
class Segment:
    """A stretch of the sandbox's life in one status, for the life bar."""

    state: str
    seconds: float
    #: its fraction of the bar (a moment-long transition still gets a sliver; a label
    #: fits only on a wide enough one)
    share: float


#: The narrowest a segment is drawn, as a fraction of the bar: a 5 ms `creating` between
#: hours of `running` must still be seen.
_MIN_SHARE = 0.012
#: The states a sandbox never leaves: drawn as a marker at the end, not a stretch.
_FINAL = ("killed", "failed")


def lifeline(points: Sequence[tuple[datetime, str]], now: datetime) -> list[Segment]:
    """Stretches of one status, from (time of an event, status after it) in log order;
    the last runs until `now` unless it is final."""
    spans: list[tuple[str, float]] = []
    current: tuple[str, datetime] | None = None
    for at, state in [*points, (now, "")]:  # a sentinel closes the last stretch
        if current is not None and state == current[0]:
            continue  # no change (a TTL set, an upload): the stretch goes on
        if current is not None:
            held = (at - current[1]).total_seconds()
            spans.append((current[0], 0.0 if current[0] in _FINAL else max(0.0, held)))
        current = (state, at)
    total = sum(s for _, s in spans) or 1.0
    weights = [max(s, total * _MIN_SHARE) for _, s in spans]
    drawn = sum(weights) or 1.0
    return [Segment(state, s, w / drawn) for (state, s), w in zip(spans, weights, strict=True)]
