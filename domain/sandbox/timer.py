"""Pure decisions of the TTL timer (expiry, and what ends on a node that is gone) and of the
fork orchestration, for the workers to call."""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

from domain.errors import Invalid
from domain.sandbox.clock import Clock, clock_of
from domain.sandbox.commands import (
    CompleteCreate,
    CompleteKill,
    CompleteResume,
    CreateSandbox,
    ForkSandbox,
    KillSandbox,
    PauseSandbox,
)
from domain.sandbox.state import Sandbox
from domain.sandbox.values import SandboxStatus, derived_command_id

__all__ = [
    "drop_command",
    "expiry_command",
    "fork_child_command",
    "orphan_commands",
    "retention_command",
]


def expiry_command(
    state: Sandbox | Clock | None, now: datetime
) -> PauseSandbox | KillSandbox | None:
    """The command the timer must issue for `state` (a sandbox, or the timer's view of
    it) at `now`, or None if nothing is due.

    Only a running sandbox expires (a paused one keeps its remaining TTL; one that is busy
    snapshotting/forking is looked at again when it is back to running). The command's id and
    `at` derive from (sandbox id, end_at), so every timer replica builds the *same* message and
    JetStream's `Nats-Msg-Id` dedup lets exactly one through; a later `end_at` (the TTL was
    extended, or the sandbox resumed) gives a new id.
    """
    clock = clock_of(state) if isinstance(state, Sandbox) else state
    if clock is None or clock.status is not SandboxStatus.RUNNING or clock.end_at is None:
        return None
    if now < clock.end_at:
        return None
    sid, end_at, action = clock.sandbox_id, clock.end_at, clock.on_timeout
    command_id = derived_command_id(sid, end_at.isoformat(), action)
    if action == "pause":
        return PauseSandbox(
            sandbox_id=sid,
            command_id=command_id,
            at=end_at,
            reason="timeout",
            keep_memory=clock.pause_memory,
        )
    return KillSandbox(sandbox_id=sid, command_id=command_id, at=end_at, reason="timeout")


def retention_command(clock: Clock, now: datetime, retention_s: float | None) -> KillSandbox | None:
    """The kill of a sandbox paused longer than `retention_s` (None: kept for ever), or
    None. Its id and `at` derive from (sandbox, paused_at), so every timer replica builds
    the same command; a resume and a new pause give a new one."""
    if retention_s is None or clock.status is not SandboxStatus.PAUSED or clock.paused_at is None:
        return None
    due = clock.paused_at + timedelta(seconds=retention_s)
    if now < due:
        return None
    return KillSandbox(
        sandbox_id=clock.sandbox_id,
        reason="retention",
        at=due,
        command_id=derived_command_id(clock.sandbox_id, "retention", clock.paused_at.isoformat()),
    )


def fork_child_command(
    parent: Sandbox, child_id: str, fork: ForkSandbox, at: datetime | None = None
) -> CreateSandbox:
    """The create of one fork child: the parent's configuration, the fork's timeout.
    `parent` is the state the fork was decided into (its `pending_children`).

    Its command id derives from the fork's, so a node that redoes a fork after a crash
    re-issues the same creates (and the children's streams dedup them).
    """
    if child_id not in parent.pending_children:
        raise Invalid(f"{child_id} is not a child of this fork")
    spec = parent.spec.model_copy(
        update={
            "timeout_s": fork.timeout_s,
            "forked_from": parent.sandbox_id,
            "volume_mounts": (),  # never shared: a fork of a sandbox with volumes is refused
        }
    )
    return CreateSandbox(
        **spec.model_dump(),
        sandbox_id=child_id,
        command_id=derived_command_id(str(fork.command_id), child_id),
        at=at or fork.at,
    )


Orphaned = CompleteCreate | CompleteResume | CompleteKill | KillSandbox


def orphan_commands(clock: Clock, why: str) -> list[Orphaned]:
    """What ends the part of a sandbox's life that was under way on a node that is gone
    for good (the fleet's timer decides it: nobody takes that node's queue any more).

    A sandbox that ran there went with the node (`lost`); a create there fails; a resume
    there fails back to paused (its capture is where it was: any node resumes it if it is
    in the repository); a kill there completes. A paused sandbox is left alone: it is
    durable, or waits for its node. Command ids derive from (sandbox, node, state), so
    every timer replica decides the same commands and each is recorded once."""
    sid, node = clock.sandbox_id, clock.node_id or ""

    def cid(what: str) -> UUID:
        return derived_command_id(sid, "node-gone", node, clock.status.value, what)

    match clock.status:
        case SandboxStatus.CREATING:
            return [
                CompleteCreate(sandbox_id=sid, node_id=node, error=why, command_id=cid("created"))
            ]
        case SandboxStatus.RESUMING:
            return [
                CompleteResume(
                    sandbox_id=sid,
                    node_id=node,
                    error=why,
                    lost_node=node,
                    command_id=cid("resumed"),
                )
            ]
        case SandboxStatus.KILLING:
            return [CompleteKill(sandbox_id=sid, error=why, command_id=cid("killed"))]
        case (
            SandboxStatus.RUNNING
            | SandboxStatus.PAUSING
            | SandboxStatus.FORKING
            | SandboxStatus.SNAPSHOTTING
        ):
            return [
                KillSandbox(sandbox_id=sid, reason="lost", command_id=cid("kill")),
                CompleteKill(sandbox_id=sid, error=why, command_id=cid("killed")),
            ]
        case _:
            return []


def drop_command(sandbox_id: str, cause: str) -> KillSandbox:
    """What the node that held a sandbox is told once the sandbox was killed in the log
    without it (its node taken for gone): a kill with reason `lost`, which such a node —
    back, or only cut off from NATS for a while — answers by dropping what it still holds
    (a VM running on as an orphan, a capture), never by a rejection. Its id derives from
    `cause`, so it is queued once."""
    return KillSandbox(
        sandbox_id=sandbox_id, reason="lost", command_id=derived_command_id(cause, "drop")
    )
