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
    SandboxDiskFull,
    SandboxFailed,
    SandboxForked,
    SandboxForkRequested,
    SandboxKilled,
    SandboxKillRequested,
    SandboxNetworkUpdated,
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
from domain.sandbox.values import NetworkPolicy, SandboxStatus

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
    u: dict[str, object]
    match event:
        case (
            SandboxPauseRequested()
            | SandboxPaused()
            | SandboxResumeRequested()
            | SandboxResumeFailed()
            | SandboxResumed()
        ):
            u = _pause_changes(event)
            if isinstance(event, SandboxResumeRequested):
                u["paused_on"] = state.node_id  # where a failed resume leaves it again
        case (
            SandboxForkRequested()
            | SandboxForked()
            | SnapshotRequested()
            | SnapshotTaken()
            | SnapshotFailed()
            | SnapshotUploaded()
        ):
            u = _copy_changes(event)
        case SandboxDiskFull():
            u = {"disk_full_at": event.at}
        case _:  # what is left: its run from creation to kill (mypy checks it is)
            u = _run_changes(event, state.network)
    command_id = getattr(event, "command_id", None)
    if command_id is not None:
        u["recent_commands"] = _remember(state, command_id)
    if u.get("status", state.status) is not S.RESUMING:
        u["resuming_command"] = None  # (only ever read while it resumes)
    return state.model_copy(update=u)


def _run_changes(
    e: SandboxCreated
    | SandboxFailed
    | SandboxKillRequested
    | SandboxKilled
    | SandboxTimeoutSet
    | SandboxNetworkUpdated,
    network: NetworkPolicy,
) -> dict[str, object]:
    match e:
        case SandboxCreated():
            return {
                "status": S.RUNNING,
                "node_id": e.node_id,
                "started_at": e.at,
                "end_at": e.end_at,
            }
        case SandboxFailed():
            return {
                "status": S.FAILED,
                "failure_reason": f"{e.operation}: {e.reason}",
                "pending_children": (),
                "pending_snapshot_id": None,
            }
        case SandboxKillRequested():
            return {"status": S.KILLING}
        case SandboxKilled():
            return {"status": S.KILLED, "pending_children": (), "pending_snapshot_id": None}
        case SandboxTimeoutSet():
            if e.end_at is not None:
                return {"timeout_s": e.timeout_s, "end_at": e.end_at}
            return {"timeout_s": e.timeout_s, "remaining_s": float(e.timeout_s)}
        case SandboxNetworkUpdated():
            egress = e.model_dump(include={"allow_internet_access", "allow_out", "deny_out"})
            return {"network": network.model_copy(update=egress)}
        case _:
            assert_never(e)


def _pause_changes(
    e: SandboxPauseRequested
    | SandboxPaused
    | SandboxResumeRequested
    | SandboxResumeFailed
    | SandboxResumed,
) -> dict[str, object]:
    match e:
        case SandboxPauseRequested():
            return {"status": S.PAUSING}
        case SandboxPaused():
            return {
                "status": S.PAUSED,
                "remaining_s": e.remaining_s,
                "paused_snapshot_id": e.snapshot_id,
                "paused_at": e.at,
            }
        case SandboxResumeRequested():
            # while resuming, the sandbox is on the node doing the resume: a kill goes there,
            # and the fleet's timer ends the resume only if *that* node is gone
            u: dict[str, object] = {"status": S.RESUMING, "resuming_command": e.command_id}
            if e.node_id is not None:
                u["node_id"] = e.node_id
            if e.timeout_s is not None:
                u |= {"remaining_s": float(e.timeout_s), "timeout_s": e.timeout_s}
            return u
        case SandboxResumeFailed():
            # back on the node it was paused on: the node that tried may hold other bytes
            # under it (and refuse it again), or be gone
            u = {"status": S.PAUSED, "paused_on": None}
            if e.node_id is not None:
                u["node_id"] = e.node_id
            return u
        case SandboxResumed():
            return {
                "status": S.RUNNING,
                "node_id": e.node_id,
                "end_at": e.end_at,
                "remaining_s": None,
                "paused_snapshot_id": None,
                "paused_at": None,
                "paused_on": None,
            }
        case _:
            assert_never(e)


def _copy_changes(
    e: SandboxForkRequested
    | SandboxForked
    | SnapshotRequested
    | SnapshotTaken
    | SnapshotFailed
    | SnapshotUploaded,
) -> dict[str, object]:
    """Forks and snapshots: copies of a running guest, which runs on once they are made."""
    match e:
        case SandboxForkRequested():
            return {"status": S.FORKING, "pending_children": e.child_ids}
        case SandboxForked():
            return {"status": S.RUNNING, "pending_children": ()}
        case SnapshotRequested():
            return {"status": S.SNAPSHOTTING, "pending_snapshot_id": e.snapshot_id}
        case SnapshotTaken() | SnapshotFailed():
            return {"status": S.RUNNING, "pending_snapshot_id": None}
        case SnapshotUploaded():
            return {"durable_snapshot_id": e.snapshot_id}
        case _:
            assert_never(e)


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
