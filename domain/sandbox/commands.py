"""Commands on the sandbox aggregate.

Client commands (Create/Pause/Resume/Kill/SetTimeout/Fork/Snapshot/UpdateNetwork) come from
the API, the timer or pipelines. `Complete*` commands are what the node worker issues after
doing the I/O a `*Requested` event asked for; `decide` turns them into the outcome events.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from domain.messages import Command
from domain.sandbox.spec import SandboxSpec
from domain.sandbox.values import SandboxId

__all__ = [
    "AnySandboxCommand",
    "CompleteCreate",
    "CompleteFork",
    "CompleteKill",
    "CompletePause",
    "CompleteResume",
    "CompleteSnapshot",
    "CreateSandbox",
    "FailureCode",
    "ForkChildResult",
    "ForkSandbox",
    "KillSandbox",
    "PauseSandbox",
    "RecordDiskFull",
    "RecordUpload",
    "ResumeSandbox",
    "SandboxCommand",
    "SetSandboxTimeout",
    "SnapshotSandbox",
    "UpdateSandboxNetwork",
]

#: who wanted it: a client, the TTL, the node that lost the VM (a crash, a dead VM), or
#: the retention of paused sandboxes (paused longer than `AENV_PAUSED_RETENTION_S`), or
#: the node rolling back a resume it recorded but could not finish releasing (a pause on
#: the capture the resume ran from, after a crash: `workers/node/reconcile.py`)
Reason = Literal["request", "timeout", "lost", "retention", "rollback"]


#: What kind of refusal a failed create is for its client (HTTP 409, 400, 404, 503:
#: `unavailable`, the template's bytes fit no disk or are nowhere — try again later).
FailureCode = Literal["conflict", "invalid", "not_found", "unavailable"]


class SandboxCommand(Command):
    """A command addressed to one sandbox aggregate."""

    aggregate: ClassVar[str] = "sandbox"
    aggregate_field: ClassVar[str] = "sandbox_id"

    sandbox_id: SandboxId


class CreateSandbox(SandboxCommand, SandboxSpec):
    """Start a sandbox from a template (or as a fork child, then `forked_from` is set): a
    spec (`SandboxSpec`) with the sandbox's id.

    `warm_on`: a hint, not part of the spec — nodes whose heartbeat said they hold a warm
    VM of the template (the API fills it). A node not among them, with none of its own,
    passes the create on once (its first delivery), so that a node that hands a warm VM
    over takes it rather than one that would restore cold. Placement stays pull-based.

    `held_on`: likewise, nodes whose heartbeat said the template's capture is on their
    disk: a node without it passes the create on once rather than fetch the capture from
    the snapshot repository (it takes the create when it comes back).

    `template_bytes`: likewise, what a node without the template's capture stores to take
    the create (the capture and the disks under it, from the template's upload record; 0:
    unknown). A node whose disk cannot make that room plus its headroom refuses it, and
    another takes it (`bus.diskroom`).

    `prefer_on`: likewise, the node a snapshot fork spread this child to (by the room
    the heartbeats said each had): any other passes it on once, so that the children of
    one fork land across the fleet rather than on whichever node pulls fastest.

    `copy_on_write`: likewise, restore the template's RAM copy-on-write, as a fork's
    children map their parent's capture (a snapshot fork's children: one RAM file per
    node, not one each; a pause writes such a child's RAM into its capture's state)."""

    creates: ClassVar[bool] = True
    warm_on: tuple[str, ...] = ()
    held_on: tuple[str, ...] = ()
    template_bytes: int = Field(default=0, ge=0)
    prefer_on: tuple[str, ...] = ()
    copy_on_write: bool = False

    @property
    def beside_parent(self) -> bool:
        """A running sandbox's fork child: it starts on its parent's node, from the capture
        taken there. A paused sandbox's child (`forked_from` set, restored copy-on-write
        from the durable capture) is placed as any create."""
        return self.forked_from is not None and not self.copy_on_write


class PauseSandbox(SandboxCommand):
    """Freeze a running sandbox; paused time does not consume its TTL. `keep_memory`
    False (E2B's filesystem-only pause) keeps only its disk: the resume boots it again."""

    reason: Reason = "request"
    keep_memory: bool = True


class ResumeSandbox(SandboxCommand):
    """Restore a paused sandbox. `timeout_s` None keeps the TTL it had left when paused.

    `node_id` is the node that takes the resume, set by it before it appends the request
    (as a create's): the log then knows who is doing it, and a node gone does not fail a
    resume another node is doing (`orphan_commands`). None from a client."""

    timeout_s: int | None = None
    node_id: str | None = None


class KillSandbox(SandboxCommand):
    """Destroy a sandbox in any state but killed."""

    reason: Reason = "request"


class SetSandboxTimeout(SandboxCommand):
    """Set the TTL to `timeout_s` from `at`. `extend_only` (E2B connect) never shortens it."""

    timeout_s: int
    extend_only: bool = False


class UpdateSandboxNetwork(SandboxCommand):
    """Replace a running sandbox's egress rules (E2B `PUT /sandboxes/{id}/network`): the
    whole set at once, what is left out is cleared. Its node applies them to the VM's
    firewall before the event records them, so the log says what the guest lives under."""

    allow_internet_access: bool = True
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()


class ForkSandbox(SandboxCommand):
    """Clone a running sandbox into `count` children (ids derived from `command_id`)."""

    count: int = 1
    timeout_s: int = 300


class SnapshotSandbox(SandboxCommand):
    """Take a named snapshot of a running sandbox (it keeps running afterwards)."""

    snapshot_id: str = Field(min_length=1, description="`name:tag`, E2B's snapshotID")


class CompleteCreate(SandboxCommand):
    """Node: the VM booted/restored and envd answers (or `error` says why not); `warm`:
    it was a warm VM the node's pool handed over, not a restore; `code`: what kind of
    refusal a failure is for the client, when the request itself could not work — a
    volume another sandbox holds, a template without volume slots."""

    node_id: str
    error: str | None = None
    warm: bool = False
    code: FailureCode | None = None


class CompletePause(SandboxCommand):
    """Node: the VM is frozen and its state saved (or `error`); `memory` False for a
    filesystem-only capture."""

    snapshot_id: str | None = None
    error: str | None = None
    memory: bool = True


class CompleteResume(SandboxCommand):
    """Node: the VM is running again on `node_id` (or `error`).

    `lost_node` is set by the fleet's timer when it fails the resume because that node is
    gone (`orphan_commands`): moot unless the sandbox is still resuming on that node — a
    timer whose view lags the log never fails a resume another node took meanwhile."""

    node_id: str
    error: str | None = None
    lost_node: str | None = None


class CompleteKill(SandboxCommand):
    """Node: the VM and its resources are gone. Kill always completes; `error` is informative."""

    error: str | None = None


class ForkChildResult(BaseModel):
    """Outcome of one child of a fork: `error` None means the child is running."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sandbox_id: SandboxId
    error: str | None = None


class CompleteFork(SandboxCommand):
    """Node: every child was attempted; the parent runs again."""

    children: tuple[ForkChildResult, ...]


class CompleteSnapshot(SandboxCommand):
    """Node: the snapshot is saved (or `error`); the sandbox keeps running either way."""

    snapshot_id: str
    size_bytes: int | None = None
    error: str | None = None
    node_id: str | None = None


class RecordUpload(SandboxCommand):
    """Node: a capture of this sandbox reached the snapshot repository."""

    snapshot_id: str
    size_bytes: int


class RecordDiskFull(SandboxCommand):
    """Node: the guest's root disk filled up (once per episode: the node notes it again only
    after the guest had room), as envd measured it."""

    used_bytes: int
    total_bytes: int


#: The closed set of sandbox commands: `decide` matches it exhaustively (the type checker
#: fails the build when a new command is added here and not decided).
AnySandboxCommand = (
    CreateSandbox
    | PauseSandbox
    | ResumeSandbox
    | KillSandbox
    | SetSandboxTimeout
    | ForkSandbox
    | SnapshotSandbox
    | UpdateSandboxNetwork
    | CompleteCreate
    | CompletePause
    | CompleteResume
    | CompleteKill
    | CompleteFork
    | CompleteSnapshot
    | RecordUpload
    | RecordDiskFull
)
