"""aenv's domain: aggregates as pure functions over frozen messages. Imports nothing of ours."""

from domain.aggregates import AGGREGATES, Aggregate, AggregateKind, aggregate_of
from domain.catalog import COMMAND_TYPES, EVENT_TYPES, EVENT_UPCASTERS
from domain.errors import Conflict, CorruptHistory, DomainError, Invalid, NotFound
from domain.messages import Command, CommandRejected, Event, Message, RejectionCode, utcnow

__all__ = [
    "AGGREGATES",
    "COMMAND_TYPES",
    "EVENT_TYPES",
    "EVENT_UPCASTERS",
    "Aggregate",
    "AggregateKind",
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
    "aggregate_of",
    "utcnow",
]
