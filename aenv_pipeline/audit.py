"""An audit of one sandbox: what its history folds to against what the read model says.

The read model is the API's `GET /sandboxes/{id}` body (E2B's field names); the client
does no HTTP itself (its dependencies are NATS and pydantic), the caller passes the body.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aenv_pipeline.events import SandboxView

__all__ = ["Mismatch", "compare"]


@dataclass(frozen=True)
class Mismatch:
    """One fact on which the log and the read model disagree."""

    field: str
    log: Any
    read_model: Any


def _time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


def compare(view: SandboxView | None, body: Mapping[str, Any] | None) -> list[Mismatch]:
    """The facts the API shows of a sandbox, from the log (`view`) and from its answer
    (`body`; None or empty: it answered 404, as it does for a killed sandbox)."""
    if view is None or view.state is None:  # never existed, or E2B shows it no more
        shown = view.status if view else None
        return [Mismatch("state", shown, body.get("state"))] if body else []
    if not body:
        return [Mismatch("state", view.state, None)]
    pairs: list[tuple[str, Any, Any]] = [
        ("state", view.state, body.get("state")),
        ("sandboxID", view.sandbox_id, body.get("sandboxID")),
        ("metadata", view.metadata, body.get("metadata") or {}),
        ("cpuCount", view.cpu_count, body.get("cpuCount")),
        ("memoryMB", view.memory_mb, body.get("memoryMB")),
    ]
    if view.state == "running":  # a paused sandbox's TTL is what it has left, not an end
        pairs.append(("endAt", view.end_at, _time(body.get("endAt"))))
    return [Mismatch(f, a, b) for f, a, b in pairs if a != b]
