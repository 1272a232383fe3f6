"""The sandbox aggregate's state: what `decide` needs, folded from its events."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import ConfigDict

from domain.sandbox.spec import SandboxSpec
from domain.sandbox.values import SandboxStatus

__all__ = ["RECENT_COMMANDS", "Sandbox"]

#: How many accepted command ids a sandbox remembers, to recognise redeliveries. A command is
#: redelivered only while it is in flight, so a short window suffices.
RECENT_COMMANDS = 16


class Sandbox(SandboxSpec):
    """One sandbox as the write side sees it: the spec it was created with (`node_id` is
    where it runs now, `timeout_s` its last full timeout), and where it is in its life.
    `None` stands for "never existed"."""

    model_config = ConfigDict(frozen=True)

    sandbox_id: str
    status: SandboxStatus
    requested_at: datetime
    started_at: datetime | None = None
    end_at: datetime | None = None
    #: TTL left when paused; None while the clock runs.
    remaining_s: float | None = None
    failure_reason: str | None = None
    pending_children: tuple[str, ...] = ()
    pending_snapshot_id: str | None = None
    #: the latest capture of this sandbox that is in the snapshot repository (durable)
    durable_snapshot_id: str | None = None
    #: the capture a paused sandbox resumes from (None while it runs)
    paused_snapshot_id: str | None = None
    #: when it was paused (None while it runs): how long it has been kept so
    paused_at: datetime | None = None
    recent_commands: tuple[UUID, ...] = ()

    @property
    def resumable_anywhere(self) -> bool:
        """Paused, and its capture is in the repository: any node can resume it."""
        return self.paused_snapshot_id is not None and (
            self.durable_snapshot_id == self.paused_snapshot_id
        )

    def seen(self, command_id: UUID) -> bool:
        """Whether this command was already accepted (a redelivery must decide nothing)."""
        return command_id in self.recent_commands
