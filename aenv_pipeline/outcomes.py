"""What a pipeline's command ends in: the stored event that answered it (`Outcome`), or an
error — the log's refusal or failure (`CommandFailed`), the ingress's (`CommandRefused`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from uuid import UUID

from nats.aio.msg import Msg

from aenv_pipeline.events import Event
from aenv_pipeline.wire import EventEnvelope

__all__ = ["ANSWERS", "FAILURES", "CommandFailed", "CommandRefused", "Outcome", "event_of"]

#: The outcomes a command waits for, besides a `SandboxFailed` and a `CommandRejected`.
ANSWERS: Mapping[str, tuple[str, ...]] = {
    "CreateSandbox": ("SandboxCreated",),
    "PauseSandbox": ("SandboxPaused",),
    "KillSandbox": ("SandboxKilled",),
}
FAILURES = ("SandboxFailed", "CommandRejected")


class CommandRefused(RuntimeError):
    """The stack's ingress refused a scoped pipeline's command before queueing it: `code`
    is `forbidden` (not this team's), `not_found`, `invalid`, `conflict` or `rate_limited`
    (then `retry_after_s` says when to try again)."""

    def __init__(self, code: str, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.retry_after_s = code, message, retry_after_s


class CommandFailed(RuntimeError):
    """The log answered the command with a refusal or a failure (`outcome` says which)."""

    def __init__(self, outcome: Outcome) -> None:
        p = outcome.event.payload
        super().__init__(f"{outcome.event.type} for {outcome.sandbox_id}: {p.get('reason')}")
        self.outcome = outcome


@dataclass(frozen=True)
class Outcome:
    """The stored event that answered a command."""

    command_id: UUID
    sandbox_id: str
    event: Event

    @property
    def ok(self) -> bool:
        return self.event.type not in FAILURES


def event_of(msg: Msg) -> Event:
    return Event(
        seq=msg.metadata.sequence.stream,
        subject=msg.subject,
        envelope=EventEnvelope.model_validate_json(msg.data),
    )
