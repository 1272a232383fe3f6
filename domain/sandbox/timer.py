"""Pure decisions of the TTL timer and of the fork orchestration, for the workers to call."""

from __future__ import annotations

from datetime import datetime

from domain.errors import Invalid
from domain.sandbox.commands import CreateSandbox, ForkSandbox, KillSandbox, PauseSandbox
from domain.sandbox.state import Sandbox
from domain.sandbox.values import SandboxStatus, derived_command_id

__all__ = ["expiry_command", "fork_child_command"]


def expiry_command(state: Sandbox | None, now: datetime) -> PauseSandbox | KillSandbox | None:
    """The command the timer must issue for `state` at `now`, or None if nothing is due.

    Only a running sandbox expires (a paused one keeps its remaining TTL; one that is busy
    snapshotting/forking is looked at again when it is back to running). The command's id and
    `at` derive from (sandbox id, end_at), so every timer replica builds the *same* message and
    JetStream's `Nats-Msg-Id` dedup lets exactly one through; a later `end_at` (the TTL was
    extended, or the sandbox resumed) gives a new id.
    """
    if state is None or state.status is not SandboxStatus.RUNNING or state.end_at is None:
        return None
    if now < state.end_at:
        return None
    action = state.lifecycle.on_timeout
    command_id = derived_command_id(state.sandbox_id, state.end_at.isoformat(), action)
    if action == "pause":
        return PauseSandbox(
            sandbox_id=state.sandbox_id, command_id=command_id, at=state.end_at, reason="timeout"
        )
    return KillSandbox(
        sandbox_id=state.sandbox_id, command_id=command_id, at=state.end_at, reason="timeout"
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
    spec = parent.spec.model_copy(update={
        "timeout_s": fork.timeout_s, "forked_from": parent.sandbox_id,
    })  # fmt: skip
    return CreateSandbox(
        **spec.model_dump(),
        sandbox_id=child_id,
        command_id=derived_command_id(str(fork.command_id), child_id),
        at=at or fork.at,
    )
