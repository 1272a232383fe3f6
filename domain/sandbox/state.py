"""The sandbox aggregate's state: what `decide` needs, folded from its events."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import ConfigDict

from domain.sandbox.spec import SandboxSpec
from domain.sandbox.values import SandboxStatus

__all__ = ["RECENT_COMMANDS", "Sandbox", "ttl_on_resume"]

#: How many accepted command ids a sandbox remembers, to recognise redeliveries. A command is
#: redelivered while it is in flight, which a NATS outage or a node's restart stretches to a
#: minute or more, and a sandbox cycled by pause and resume accepts a few commands a second
#: meanwhile: the fleet test saw a resume fall out of a window of 16 within 13 s, be decided
#: anew and answered twice. 256 covers JetStream's 2-minute dedup window at 2 commands a
#: second; most sandboxes never hold more than a handful.
RECENT_COMMANDS = 256


def ttl_on_resume(remaining_s: float | None, timeout_s: int) -> float:
    """The seconds a paused sandbox runs once resumed without a new timeout: the TTL it had
    left when paused (paused time does not consume it), or — paused by its own expiry,
    nothing left — its last full timeout again. What `aenv ls` and `aenv timeout` show for
    a paused sandbox, and what its resume gives it."""
    return remaining_s if remaining_s else float(timeout_s)


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
    #: while it resumes: the node it was paused on, where a failed resume leaves it again
    paused_on: str | None = None
    #: while it resumes: the request doing it. A redelivery of an earlier resume, answered
    #: before its node died, must not do (and answer) a later request's resume again
    resuming_command: UUID | None = None
    #: when its guest last filled its root disk (`SandboxDiskFull`); None: never
    disk_full_at: datetime | None = None
    recent_commands: tuple[UUID, ...] = ()

    @property
    def ttl_on_resume(self) -> float:
        """`ttl_on_resume` of this sandbox (meaningful while it is paused)."""
        return ttl_on_resume(self.remaining_s, self.timeout_s)

    @property
    def resumable_anywhere(self) -> bool:
        """Paused, and its capture is in the repository: any node can resume it."""
        return self.paused_snapshot_id is not None and (
            self.durable_snapshot_id == self.paused_snapshot_id
        )

    def seen(self, command_id: UUID) -> bool:
        """Whether this command was already accepted (a redelivery must decide nothing)."""
        return command_id in self.recent_commands
