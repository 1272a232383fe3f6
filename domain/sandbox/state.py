"""The sandbox aggregate's state: what `decide` needs, folded from its events."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from domain.sandbox.values import Lifecycle, NetworkPolicy, SandboxStatus

__all__ = ["RECENT_COMMANDS", "Sandbox"]

#: How many accepted command ids a sandbox remembers, to recognise redeliveries. A command is
#: redelivered only while it is in flight, so a short window suffices.
RECENT_COMMANDS = 16


class Sandbox(BaseModel):
    """One sandbox as the write side sees it. `None` stands for "never existed"."""

    model_config = ConfigDict(frozen=True)

    sandbox_id: str
    status: SandboxStatus
    template_id: str
    alias: str | None
    team_id: str | None
    api_key_id: str | None
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    envd_version: str
    envd_access_token: str | None
    metadata: dict[str, str]
    env_vars: dict[str, str]
    lifecycle: Lifecycle
    network: NetworkPolicy
    forked_from: str | None
    node_id: str | None
    requested_at: datetime
    timeout_s: int
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
