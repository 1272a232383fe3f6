"""The sandbox aggregate's fold: `evolve` (one event) and `fold` (a history).

Total over every history `decide` can produce; anything else is `CorruptHistory`.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce
from typing import assert_never, cast

from domain.errors import CorruptHistory
from domain.messages import CommandRejected, Event
from domain.sandbox.events import (
    SANDBOX_EVENTS,
    AnySandboxEvent,
    SandboxCreated,
    SandboxFailed,
    SandboxForked,
    SandboxForkRequested,
    SandboxKilled,
    SandboxKillRequested,
    SandboxPaused,
    SandboxPauseRequested,
    SandboxRequested,
    SandboxResumed,
    SandboxResumeFailed,
    SandboxResumeRequested,
    SandboxTimeoutSet,
    SnapshotFailed,
    SnapshotRequested,
    SnapshotTaken,
    SnapshotUploaded,
)
from domain.sandbox.state import RECENT_COMMANDS, Sandbox
from domain.sandbox.values import SandboxStatus

__all__ = ["State", "evolve", "fold"]

State = Sandbox | None
S = SandboxStatus


def _remember(s: Sandbox, command_id: object) -> tuple[object, ...]:
    return (*s.recent_commands, command_id)[-RECENT_COMMANDS:]


def evolve(state: State, event: Event) -> State:
    """The state after `event`. Total over histories `decide` can produce."""
    if isinstance(event, CommandRejected):
        return state  # a refusal changes nothing; it is in the log for waiters and auditors
    if not isinstance(event, SANDBOX_EVENTS):
        raise CorruptHistory(f"not a sandbox event: {type(event).__name__}")
    return _evolve(state, cast(AnySandboxEvent, event))


def _evolve(state: State, event: AnySandboxEvent) -> State:
    if isinstance(event, SandboxRequested):
        if state is not None:
            raise CorruptHistory(f"{event.sandbox_id} requested twice")
        return _requested(event)
    if state is None:
        raise CorruptHistory(f"{type(event).__name__} before SandboxRequested")
    u: dict[str, object] = {}
    match event:
        case SandboxCreated():
            u = {
                "status": S.RUNNING,
                "node_id": event.node_id,
                "started_at": event.at,
                "end_at": event.end_at,
            }
        case SandboxFailed():
            u = {
                "status": S.FAILED,
                "failure_reason": f"{event.operation}: {event.reason}",
                "pending_children": (),
                "pending_snapshot_id": None,
            }
        case SandboxPauseRequested():
            u = {"status": S.PAUSING}
        case SandboxPaused():
            u = {
                "status": S.PAUSED,
                "remaining_s": event.remaining_s,
                "paused_snapshot_id": event.snapshot_id,
                "paused_at": event.at,
            }
        case SandboxResumeRequested():
            u = {"status": S.RESUMING}
            if event.timeout_s is not None:
                u |= {"remaining_s": float(event.timeout_s), "timeout_s": event.timeout_s}
        case SandboxResumeFailed():
            u = {"status": S.PAUSED}
        case SandboxResumed():
            u = {
                "status": S.RUNNING,
                "node_id": event.node_id,
                "end_at": event.end_at,
                "remaining_s": None,
                "paused_snapshot_id": None,
                "paused_at": None,
            }
        case SandboxKillRequested():
            u = {"status": S.KILLING}
        case SandboxKilled():
            u = {"status": S.KILLED, "pending_children": (), "pending_snapshot_id": None}
        case SandboxTimeoutSet():
            u = {"timeout_s": event.timeout_s}
            u |= (
                {"end_at": event.end_at}
                if event.end_at is not None
                else {"remaining_s": float(event.timeout_s)}
            )
        case SandboxForkRequested():
            u = {"status": S.FORKING, "pending_children": event.child_ids}
        case SandboxForked():
            u = {"status": S.RUNNING, "pending_children": ()}
        case SnapshotRequested():
            u = {"status": S.SNAPSHOTTING, "pending_snapshot_id": event.snapshot_id}
        case SnapshotTaken() | SnapshotFailed():
            u = {"status": S.RUNNING, "pending_snapshot_id": None}
        case SnapshotUploaded():
            u = {"durable_snapshot_id": event.snapshot_id}
        case _:
            assert_never(event)
    command_id = getattr(event, "command_id", None)
    if command_id is not None:
        u["recent_commands"] = _remember(state, command_id)
    return state.model_copy(update=u)


def _requested(e: SandboxRequested) -> Sandbox:
    return Sandbox(
        **e.spec.model_dump(),
        sandbox_id=e.sandbox_id,
        status=S.CREATING,
        requested_at=e.at,
        recent_commands=(e.command_id,),
    )


def fold(events: Iterable[Event], state: State = None) -> State:
    """The state after all `events`, in order, starting from `state`."""
    return reduce(evolve, events, state)
