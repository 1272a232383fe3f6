"""aenv's domain: aggregates as pure functions over frozen messages. Imports nothing of ours."""

from domain.catalog import COMMAND_TYPES, EVENT_TYPES, EVENT_UPCASTERS
from domain.errors import Conflict, CorruptHistory, DomainError, Invalid, NotFound
from domain.messages import Command, CommandRejected, Event, Message, RejectionCode, utcnow

__all__ = [
    "COMMAND_TYPES",
    "EVENT_TYPES",
    "EVENT_UPCASTERS",
    "Command",
    "CommandRejected",
    "Conflict",
    "CorruptHistory",
    "DomainError",
    "Event",
    "Invalid",
    "Message",
    "NotFound",
    "RejectionCode",
    "utcnow",
]
