"""Positions in the log and events as read back from it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from bus.envelope import EventEnvelope
from domain import Event

__all__ = ["NEW", "RecordedEvent", "Version"]


class Version(NamedTuple):
    """Where an aggregate stands: revision (its event count), last event's stream sequence."""

    revision: int
    seq: int


NEW = Version(0, 0)


@dataclass(frozen=True)
class RecordedEvent:
    """An event as read back from the stream, with its position."""

    seq: int
    subject: str
    envelope: EventEnvelope
    event: Event
    #: NATS headers of a live delivery (trace context); None when read back by direct get.
    headers: Mapping[str, str] | None = None

    @property
    def time(self) -> datetime:
        return self.envelope.occurred_at
