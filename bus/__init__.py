"""aenv's bus: NATS JetStream as the event log (AENV_EVT) and the command queues (AENV_CMD).

Imports only the domain, nats-py and OpenTelemetry. Public API::

    Bus.connect(settings)            -> .store(aggregate) / .sandboxes/.templates/… (EventStore
                                        per `domain.AGGREGATES` entry), .commands
    EventStore.append/load/read/version/append_rejection/watch/wait_for_outcome,
    Version, RecordedEvent
    CommandBus.to_node/to_placement/send, decode_command
    CommandConsumer(js, settings, ConsumerSpec, handler, rejections), Delivery
    EventFeed (ordered replay in batches), stream_last_seq
    ensure_streams, delete_all, Names/AggregateKind (subjects), headers
    envelope: EventEnvelope, CommandEnvelope, MessageContext, export_json_schema
    errors: BusError, ConcurrencyError, PublishError, DecodeError, RetryableError, PermanentError,
        ReplicasMismatch, LimitsMismatch
"""

from bus.commands import CommandBus, CommandReceipt, aggregate_id_of, decode_command, verb_of
from bus.connection import Bus
from bus.consumer import CommandConsumer, Delivery, Handler, RejectionSink
from bus.envelope import (
    CommandEnvelope,
    EventEnvelope,
    MessageContext,
    Registry,
    export_json_schema,
)
from bus.errors import (
    BusError,
    ConcurrencyError,
    DecodeError,
    InvalidName,
    LimitsMismatch,
    PermanentError,
    PublishError,
    ReplicasMismatch,
    RetryableError,
)
from bus.feed import EventFeed, stream_last_seq
from bus.pull import ConsumerSpec
from bus.settings import BusSettings
from bus.setup import delete_all, ensure_streams
from bus.store import EventStore, RecordedEvent, Version
from bus.subjects import COMMAND_VERBS, AggregateKind, Names

__all__ = [
    "COMMAND_VERBS",
    "AggregateKind",
    "Bus",
    "BusError",
    "BusSettings",
    "CommandBus",
    "CommandConsumer",
    "CommandEnvelope",
    "CommandReceipt",
    "ConcurrencyError",
    "ConsumerSpec",
    "DecodeError",
    "Delivery",
    "EventEnvelope",
    "EventFeed",
    "EventStore",
    "Handler",
    "InvalidName",
    "LimitsMismatch",
    "MessageContext",
    "Names",
    "PermanentError",
    "PublishError",
    "RecordedEvent",
    "Registry",
    "RejectionSink",
    "ReplicasMismatch",
    "RetryableError",
    "Version",
    "aggregate_id_of",
    "decode_command",
    "delete_all",
    "ensure_streams",
    "export_json_schema",
    "stream_last_seq",
    "verb_of",
]
