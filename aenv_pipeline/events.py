"""Events as a pipeline reads them, and the audit fold of one sandbox's history.

`SandboxView` folds the facts an audit compares with the read model (`GET /sandboxes/{id}`):
status, node, TTL end, template and metadata. The rules are the server's `evolve`
(`domain/sandbox/evolve.py`), restricted to those facts; `tests/unit/pipeline/test_fold.py`
folds the same histories with both and compares.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from aenv_pipeline.wire import EventEnvelope

__all__ = ["PUBLIC_STATE", "Event", "SandboxView", "fold"]


@dataclass(frozen=True)
class Event:
    """One stored event: where it is in the log (`seq`, `subject`) and its envelope."""

    seq: int
    subject: str
    envelope: EventEnvelope

    @property
    def type(self) -> str:
        return self.envelope.type

    @property
    def sandbox_id(self) -> str:
        return self.envelope.aggregate_id

    @property
    def payload(self) -> dict[str, Any]:
        return self.envelope.payload

    @property
    def time(self) -> datetime:
        return self.envelope.occurred_at


#: Status after each event that moves a sandbox in its life (the others leave it).
_STATUS: Mapping[str, str] = {
    "SandboxRequested": "creating",
    "SandboxCreated": "running",
    "SandboxFailed": "failed",
    "SandboxPauseRequested": "pausing",
    "SandboxPaused": "paused",
    "SandboxResumeRequested": "resuming",
    "SandboxResumeFailed": "paused",
    "SandboxResumed": "running",
    "SandboxKillRequested": "killing",
    "SandboxKilled": "killed",
    "SandboxForkRequested": "forking",
    "SandboxForked": "running",
    "SnapshotRequested": "snapshotting",
    "SnapshotTaken": "running",
    "SnapshotFailed": "running",
}

#: E2B's two-valued `state` of a status (`domain.sandbox.public_state`); others are not shown.
PUBLIC_STATE: Mapping[str, str] = {
    "running": "running",
    "snapshotting": "running",
    "forking": "running",
    "pausing": "paused",
    "paused": "paused",
    "resuming": "paused",
}


@dataclass(frozen=True)
class SandboxView:
    """What the log says of one sandbox."""

    sandbox_id: str
    status: str
    template_id: str
    team_id: str | None
    cpu_count: int
    memory_mb: int
    metadata: dict[str, str] = field(default_factory=dict)
    node_id: str | None = None
    end_at: datetime | None = None
    version: int = 0
    last_seq: int = 0

    @property
    def state(self) -> str | None:
        """E2B's `state` (`running`/`paused`); None where E2B shows none (creating, killed…)."""
        return PUBLIC_STATE.get(self.status)


def _spec(payload: dict[str, Any]) -> dict[str, Any]:
    spec = payload.get("spec")
    return spec if isinstance(spec, dict) else payload  # v1 had the spec's fields flat


def _requested(e: Event) -> SandboxView:
    spec = _spec(e.payload)
    return SandboxView(
        sandbox_id=e.sandbox_id,
        status="creating",
        template_id=spec["template_id"],
        team_id=spec.get("team_id"),
        cpu_count=spec.get("cpu_count", 2),
        memory_mb=spec.get("memory_mb", 512),
        metadata=dict(spec.get("metadata") or {}),
        node_id=spec.get("node_id"),
    )


def evolve(view: SandboxView | None, e: Event) -> SandboxView | None:
    """The view after `e` (None: no sandbox yet)."""
    if e.type == "SandboxRequested":
        view = _requested(e)
    if view is None:
        return None  # a refusal of a create that never started: nothing exists
    changes: dict[str, Any] = {"version": e.envelope.aggregate_version, "last_seq": e.seq}
    if (status := _STATUS.get(e.type)) is not None:
        changes["status"] = status
    if e.type in ("SandboxCreated", "SandboxResumed"):
        changes["node_id"] = e.payload["node_id"]
        changes["end_at"] = datetime.fromisoformat(e.payload["end_at"])
    if e.type == "SandboxTimeoutSet" and e.payload.get("end_at"):
        changes["end_at"] = datetime.fromisoformat(e.payload["end_at"])
    return replace(view, **changes)


def fold(events: Iterable[Event]) -> SandboxView | None:
    """One sandbox's history, from its first event, into its view."""
    view: SandboxView | None = None
    for e in events:
        view = evolve(view, e)
    return view
