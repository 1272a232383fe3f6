"""Base classes of every command and event: frozen pydantic models.

Commands are imperative (`PauseSandbox`) and carry a `command_id` that doubles as the NATS
dedup id; events are past tense (`SandboxPaused`) and carry a `schema_version` class
attribute that the bus writes into the envelope and upcasts on read.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import ClassVar, Literal
from uuid import UUID, uuid4

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

__all__ = ["Command", "CommandRejected", "Event", "Message", "RejectionCode", "utcnow"]


def utcnow() -> datetime:
    """The edge's clock. Only used as a default when a command is built, never in `decide`."""
    return datetime.now(UTC)


class Message(BaseModel):
    """Any message on the bus: immutable once built."""

    model_config = ConfigDict(frozen=True)


class Command(Message):
    """Something a client asks for. May be refused; `command_id` makes retries idempotent.

    Every command addresses one aggregate: `aggregate` is its kind (its events — and its
    rejection, if it is refused — go to that aggregate's subject), `aggregate_field` the
    field holding its id. Each aggregate's commands share a base that sets both."""

    # Commands arrive from pipelines that publish JSON straight to NATS: a typo'd field must
    # be a validation error (→ CommandRejected), not silently dropped.
    model_config = ConfigDict(frozen=True, extra="forbid")

    aggregate: ClassVar[str] = ""
    aggregate_field: ClassVar[str] = ""
    #: Starts a new aggregate: a writer may decide it on the empty state without reading
    #: the log first (an append then fails if the aggregate exists after all).
    creates: ClassVar[bool] = False

    command_id: UUID = Field(default_factory=uuid4)
    at: AwareDatetime = Field(default_factory=utcnow, description="issuer's clock, tz-aware")

    @property
    def aggregate_id(self) -> str:
        """The id of the aggregate this command addresses."""
        value = getattr(self, self.aggregate_field, None) if self.aggregate_field else None
        if not isinstance(value, str):
            raise TypeError(f"{type(self).__name__} names no aggregate")
        return value


class Event(Message):
    """Something that happened. Never refused, never changed; old versions are upcast."""

    # Readers ignore fields they do not know so that older code can read newer events
    # (fields are deprecated, never deleted).
    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: ClassVar[int] = 1

    at: AwareDatetime = Field(description="when it happened (the deciding command's clock)")


#: `forbidden`: the sender's credentials do not cover the command (a pipeline of another
#: team, `api/ingress.py`)
RejectionCode = Literal[
    "not_found", "conflict", "invalid", "permanent", "unavailable", "internal", "forbidden"
]


class CommandRejected(Event):
    """A command ended without effect; appended to the aggregate's subject so waiters see it."""

    aggregate_id: str
    command_id: UUID
    command_type: str
    code: RejectionCode
    reason: str
