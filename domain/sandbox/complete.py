"""Node completions: what the node worker's report of work it did (or failed to do) for a
request decides on the sandbox.

Apart from `decide`'s client requests because their rule differs: a completion is news only
while its operation is in progress, and moot once a kill or a failure came first (a late
report of work that no longer matters). Pure, like `decide`, which dispatches here.
"""

from __future__ import annotations

from datetime import timedelta
from typing import assert_never

from domain.errors import Conflict, Invalid, NotFound
from domain.sandbox.commands import (
    CompleteCreate,
    CompleteFork,
    CompleteKill,
    CompletePause,
    CompleteResume,
    CompleteSnapshot,
    RecordDiskFull,
    RecordUpload,
    SandboxCommand,
)
from domain.sandbox.events import (
    ForkOutcome,
    SandboxCreated,
    SandboxDiskFull,
    SandboxEvent,
    SandboxFailed,
    SandboxForked,
    SandboxKilled,
    SandboxPaused,
    SandboxResumed,
    SandboxResumeFailed,
    SnapshotFailed,
    SnapshotTaken,
    SnapshotUploaded,
)
from domain.sandbox.evolve import State
from domain.sandbox.state import Sandbox
from domain.sandbox.values import SandboxStatus

__all__ = ["Completion", "decide_completion"]

S = SandboxStatus
#: States after which a late node completion is moot (kill supersedes, failure is final).
_SUPERSEDED = frozenset({S.KILLING, S.KILLED, S.FAILED})

#: What a node reports having done (or failed to do) for a request.
Completion = (
    CompleteCreate
    | CompletePause
    | CompleteResume
    | CompleteKill
    | CompleteFork
    | CompleteSnapshot
    | RecordUpload
    | RecordDiskFull
)


def decide_completion(state: State, command: Completion) -> list[SandboxEvent]:
    """A node's report of work it did: each handler decides whether it is still news."""
    match command:
        case CompleteCreate():
            return _complete_create(state, command)
        case CompletePause():
            return _complete_pause(state, command)
        case CompleteResume():
            return _complete_resume(state, command)
        case CompleteKill():
            return _complete_kill(state, command)
        case CompleteFork():
            return _complete_fork(state, command)
        case CompleteSnapshot():
            return _complete_snapshot(state, command)
        case RecordUpload():
            return _record_upload(state, command)
        case RecordDiskFull():
            return _record_disk_full(state, command)
        case _:
            assert_never(command)


def _awaiting(state: State, expected: SandboxStatus) -> Sandbox | None:
    """The state if a completion applies to it; None if it is moot (kill/failure came first)."""
    if state is None:
        raise NotFound("sandbox not found")
    if state.status is expected:
        return state
    if state.status in _SUPERSEDED:
        return None
    raise Conflict(f"no {expected} operation in progress (sandbox is {state.status})")


def _failed(s: Sandbox, c: SandboxCommand, operation: str, error: str) -> list[SandboxEvent]:
    return [SandboxFailed(sandbox_id=s.sandbox_id, at=c.at, operation=operation, reason=error)]


def _complete_create(state: State, c: CompleteCreate) -> list[SandboxEvent]:
    s = _awaiting(state, S.CREATING)
    if s is None:
        return []
    if c.error is not None:
        return [
            SandboxFailed(
                sandbox_id=s.sandbox_id, at=c.at, operation="create", reason=c.error, code=c.code
            )
        ]
    return [
        SandboxCreated(
            sandbox_id=s.sandbox_id,
            at=c.at,
            node_id=c.node_id,
            end_at=c.at + timedelta(seconds=s.timeout_s),
            warm=c.warm,
        )
    ]


def _complete_pause(state: State, c: CompletePause) -> list[SandboxEvent]:
    s = _awaiting(state, S.PAUSING)
    if s is None:
        return []
    if c.error is not None:
        return _failed(s, c, "pause", c.error)
    remaining = 0.0 if s.end_at is None else max(0.0, (s.end_at - c.at).total_seconds())
    return [
        SandboxPaused(
            sandbox_id=s.sandbox_id,
            at=c.at,
            remaining_s=remaining,
            snapshot_id=c.snapshot_id,
            memory=c.memory,
        )
    ]


def _complete_resume(state: State, c: CompleteResume) -> list[SandboxEvent]:
    if state is not None and state.status is S.PAUSED:
        # the resume was failed meanwhile (the fleet's timer took its node for gone): a
        # late report of it is moot, and the node that brought a VM up drops it again
        # (`workers.node.verbs.failed_meanwhile`)
        return []
    s = _awaiting(state, S.RESUMING)
    if s is None or (c.lost_node is not None and s.node_id != c.lost_node):
        return []  # (a lost node's end of a resume another node is doing: not its own)
    if c.error is not None:  # the capture is untouched: still paused, resumable later
        return [
            SandboxResumeFailed(
                sandbox_id=s.sandbox_id, at=c.at, reason=c.error, node_id=s.paused_on
            )
        ]
    ttl = s.ttl_on_resume  # a sandbox paused by its own expiry: its last full timeout
    return [
        SandboxResumed(
            sandbox_id=s.sandbox_id,
            at=c.at,
            node_id=c.node_id,
            end_at=c.at + timedelta(seconds=ttl),
        )
    ]


def _complete_kill(state: State, c: CompleteKill) -> list[SandboxEvent]:
    if state is not None and state.status is S.KILLED:
        return []  # a second report of the same kill
    s = _awaiting(state, S.KILLING)
    if s is None:
        return []
    return [SandboxKilled(sandbox_id=s.sandbox_id, at=c.at, error=c.error)]


def _complete_fork(state: State, c: CompleteFork) -> list[SandboxEvent]:
    s = _awaiting(state, S.FORKING)
    if s is None:
        return []
    reported = {r.sandbox_id: r.error for r in c.children}
    unknown = set(reported) - set(s.pending_children)
    if unknown:
        raise Invalid(f"fork result names children that were not requested: {sorted(unknown)}")
    children = tuple(
        ForkOutcome(sandbox_id=cid, error=reported.get(cid, "child was not attempted"))
        for cid in s.pending_children
    )
    return [SandboxForked(sandbox_id=s.sandbox_id, at=c.at, children=children)]


def _record_upload(state: State, c: RecordUpload) -> list[SandboxEvent]:
    """Durability of a capture is a fact whenever it arrives; moot once the sandbox is gone
    (its captures are deleted), and recorded once per capture."""
    if state is None or state.status in (S.KILLED, S.FAILED):
        return []
    if state.durable_snapshot_id == c.snapshot_id:
        return []
    return [
        SnapshotUploaded(
            sandbox_id=state.sandbox_id, at=c.at, snapshot_id=c.snapshot_id, size_bytes=c.size_bytes
        )
    ]


def _record_disk_full(state: State, c: RecordDiskFull) -> list[SandboxEvent]:
    """A guest's full disk is news while the sandbox lives; moot once it is being killed
    (a late sample of a guest that is going)."""
    if state is None or state.status in _SUPERSEDED:
        return []
    return [
        SandboxDiskFull(
            sandbox_id=state.sandbox_id,
            at=c.at,
            command_id=c.command_id,
            used_bytes=c.used_bytes,
            total_bytes=c.total_bytes,
        )
    ]


def _complete_snapshot(state: State, c: CompleteSnapshot) -> list[SandboxEvent]:
    s = _awaiting(state, S.SNAPSHOTTING)
    if s is None:
        return []
    if c.snapshot_id != s.pending_snapshot_id:
        raise Conflict(f"snapshot {c.snapshot_id} is not the one in progress")
    if c.error is not None:
        return [
            SnapshotFailed(
                sandbox_id=s.sandbox_id, at=c.at, snapshot_id=c.snapshot_id, reason=c.error
            )
        ]
    return [
        SnapshotTaken(
            sandbox_id=s.sandbox_id,
            at=c.at,
            snapshot_id=c.snapshot_id,
            size_bytes=c.size_bytes,
            node_id=c.node_id,
        )
    ]
