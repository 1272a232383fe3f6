"""Events of the sandbox aggregate: the closed set that `evolve` folds.

`*Requested` events record an accepted command (and its id, so a redelivery is recognised);
the outcome events (`SandboxCreated`, `SandboxPaused`, …, `SandboxFailed`) record what the
node actually did.
"""

from __future__ import annotations

from typing import ClassVar, Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict

from domain.messages import Event
from domain.sandbox.commands import FailureCode
from domain.sandbox.spec import SandboxSpec

__all__ = [
    "SANDBOX_EVENTS",
    "AnySandboxEvent",
    "ForkOutcome",
    "SandboxCreated",
    "SandboxDiskFull",
    "SandboxEvent",
    "SandboxFailed",
    "SandboxForkRequested",
    "SandboxForked",
    "SandboxKillRequested",
    "SandboxKilled",
    "SandboxNetworkUpdated",
    "SandboxPauseRequested",
    "SandboxPaused",
    "SandboxRequested",
    "SandboxResumeFailed",
    "SandboxResumeRequested",
    "SandboxResumed",
    "SandboxTimeoutSet",
    "SnapshotFailed",
    "SnapshotRequested",
    "SnapshotTaken",
    "SnapshotUploaded",
]

#: who wanted it: a client, the TTL, the node that lost the VM (a crash, a dead VM), or
#: the retention of paused sandboxes (paused longer than `AENV_PAUSED_RETENTION_S`), or
#: the node rolling back a resume it recorded but could not finish releasing (a pause on
#: the capture the resume ran from, after a crash: `workers/node/reconcile.py`)
Reason = Literal["request", "timeout", "lost", "retention", "rollback"]


class SandboxEvent(Event):
    """An event of one sandbox."""

    sandbox_id: str


class SandboxRequested(SandboxEvent):
    """A create was accepted: everything the sandbox is, before any VM exists. v2 carries
    the spec as one value; v1 had its fields flat (`spec.upcast_requested_v1`)."""

    schema_version: ClassVar[int] = 2

    command_id: UUID
    spec: SandboxSpec


class SandboxCreated(SandboxEvent):
    """The VM runs on `node_id` and envd answers; the TTL starts now. `warm`: the node
    handed over a VM of its warm pool (restored before the request) instead of restoring
    one for it — for audits and benchmarks; the sandbox is the same either way."""

    node_id: str
    end_at: AwareDatetime
    warm: bool = False


class SandboxFailed(SandboxEvent):
    """An operation failed and left the sandbox unusable; only kill is possible now.
    `code`: a create refused for a reason of the client's (see `CompleteCreate.code`)."""

    operation: str
    reason: str
    code: FailureCode | None = None


class SandboxPauseRequested(SandboxEvent):
    command_id: UUID
    reason: Reason
    #: False: a filesystem-only pause (its disk, not its memory)
    keep_memory: bool = True


class SandboxPaused(SandboxEvent):
    """Frozen. `remaining_s` is the TTL it had left; paused time does not consume it."""

    remaining_s: float
    snapshot_id: str | None
    #: whether the capture holds the guest's memory (False: a filesystem-only pause, whose
    #: resume boots the disk again)
    memory: bool = True


class SandboxResumeRequested(SandboxEvent):
    command_id: UUID
    timeout_s: int | None
    #: the node that took the resume (it runs the sandbox while resuming); None in
    #: histories from before nodes named themselves: still the node it was paused on
    node_id: str | None = None


class SandboxResumed(SandboxEvent):
    node_id: str
    end_at: AwareDatetime


class SandboxResumeFailed(SandboxEvent):
    """A resume did not happen (e.g. its capture could not be fetched while S3 was down):
    nothing was half-restored, the sandbox stays paused and may be resumed again.

    `node_id`: the node it was paused on, where it is left (the node that tried may hold
    other bytes under it, refuse it again, or be gone); None in histories from before
    resumes named their node: left where the request left it."""

    reason: str
    node_id: str | None = None


class SandboxKillRequested(SandboxEvent):
    command_id: UUID
    reason: Reason


class SandboxKilled(SandboxEvent):
    """Gone for good: every later command on this id is NotFound."""

    error: str | None = None


class SandboxTimeoutSet(SandboxEvent):
    """New TTL: `end_at` for a live sandbox, or (paused) the remaining seconds `timeout_s`."""

    command_id: UUID
    timeout_s: int
    end_at: AwareDatetime | None


class SandboxNetworkUpdated(SandboxEvent):
    """The sandbox's egress rules were replaced (and its node's firewall swapped to them):
    from now on, and on every resume, it lives under these; `allow_public_traffic` (ingress)
    is not part of an update and stays as created."""

    command_id: UUID
    allow_internet_access: bool
    allow_out: tuple[str, ...]
    deny_out: tuple[str, ...]


class SandboxForkRequested(SandboxEvent):
    command_id: UUID
    child_ids: tuple[str, ...]
    timeout_s: int


class ForkOutcome(BaseModel):
    """One child of a fork: `error` None means it runs (its own stream says the rest)."""

    model_config = ConfigDict(frozen=True)

    sandbox_id: str
    error: str | None = None


class SandboxForked(SandboxEvent):
    """Every child was attempted; the parent runs again."""

    children: tuple[ForkOutcome, ...]


class SnapshotRequested(SandboxEvent):
    command_id: UUID
    snapshot_id: str


class SnapshotTaken(SandboxEvent):
    snapshot_id: str
    size_bytes: int | None = None
    #: where the capture lives (None in events from before it was recorded)
    node_id: str | None = None


class SnapshotFailed(SandboxEvent):
    """The snapshot could not be saved; the sandbox itself runs on."""

    snapshot_id: str
    reason: str


class SnapshotUploaded(SandboxEvent):
    """A capture of this sandbox (its pause, or a persistent snapshot) is in the snapshot
    repository: durable beyond its node. Changes nothing but where it can be restored."""

    snapshot_id: str
    size_bytes: int


class SandboxDiskFull(SandboxEvent):
    """The guest filled its own root disk (its writes fail with ENOSPC, envd's file uploads
    answer 507): news for its owner, not a change of its life — it runs on."""

    command_id: UUID
    used_bytes: int
    total_bytes: int


#: The closed set of sandbox events: `evolve` matches it exhaustively.
AnySandboxEvent = (
    SandboxRequested
    | SandboxCreated
    | SandboxFailed
    | SandboxPauseRequested
    | SandboxPaused
    | SandboxResumeRequested
    | SandboxResumed
    | SandboxResumeFailed
    | SandboxKillRequested
    | SandboxKilled
    | SandboxTimeoutSet
    | SandboxNetworkUpdated
    | SandboxForkRequested
    | SandboxForked
    | SnapshotRequested
    | SnapshotTaken
    | SnapshotFailed
    | SnapshotUploaded
    | SandboxDiskFull
)
#: The same set as classes, for `isinstance` at the edge of the fold.
SANDBOX_EVENTS: tuple[type[SandboxEvent], ...] = (
    SandboxRequested,
    SandboxCreated,
    SandboxFailed,
    SandboxPauseRequested,
    SandboxPaused,
    SandboxResumeRequested,
    SandboxResumed,
    SandboxResumeFailed,
    SandboxKillRequested,
    SandboxKilled,
    SandboxTimeoutSet,
    SandboxNetworkUpdated,
    SandboxForkRequested,
    SandboxForked,
    SnapshotRequested,
    SnapshotTaken,
    SnapshotFailed,
    SnapshotUploaded,
    SandboxDiskFull,
)
