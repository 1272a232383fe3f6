"""The versioned JSON envelope every command and event travels in, and the type registry.

Wire format (one JSON object per NATS message)::

    {"event_id": …, "type": "SandboxPaused", "schema_version": 1, "aggregate_id": "…",
     "aggregate_version": 7, "occurred_at": "2026-…Z", "causation_id": …,
     "correlation_id": …, "actor": "apikey:k1", "payload": {…}}

Commands use the same shape with `command_id` and `issued_at` instead of the event fields.
Reading an older `schema_version` runs the registered upcasters, one version step at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar
from uuid import UUID, uuid4, uuid5

from pydantic import AwareDatetime, BaseModel, ConfigDict, ValidationError

from bus.errors import DecodeError
from domain import COMMAND_TYPES, EVENT_TYPES, EVENT_UPCASTERS, Command, Event, Message

__all__ = [
    "CommandEnvelope",
    "EventEnvelope",
    "MessageContext",
    "Registry",
    "commands",
    "decode_command_envelope",
    "decode_event",
    "derive_event_id",
    "encode_command",
    "encode_event",
    "events",
    "export_json_schema",
]

M = TypeVar("M", bound=Message)
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

_EVENT_ID_NS = UUID("2b6f3f59-52f4-4c1e-8d58-6e7f3c7b9a10")


class _Envelope(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    type: str
    schema_version: int
    aggregate_id: str
    causation_id: UUID | None = None
    correlation_id: UUID | None = None
    actor: str | None = None
    payload: dict[str, Any]


class EventEnvelope(_Envelope):
    """An event as stored in AENV_EVT."""

    event_id: UUID
    aggregate_version: int
    occurred_at: AwareDatetime


class CommandEnvelope(_Envelope):
    """A command as queued in AENV_CMD. `aggregate_kind` names the aggregate the command
    addresses (`sandbox`, `template`, ...): a rejection is appended there, where whoever
    sent it waits. Absent (a pipeline's hand-written envelope): the type's own kind."""

    command_id: UUID
    issued_at: AwareDatetime
    aggregate_kind: str | None = None

    @property
    def kind(self) -> str | None:
        """The addressed aggregate's kind: the envelope's word, else the command type's."""
        if self.aggregate_kind:
            return self.aggregate_kind
        cls = commands.types.get(self.type)
        return cls.aggregate if cls is not None and cls.aggregate else None


class HasEnvelope(Protocol):
    """A recorded event (`bus.records.RecordedEvent`)."""

    @property
    def envelope(self) -> EventEnvelope: ...


@dataclass(frozen=True)
class MessageContext:
    """Who asked and why: copied from a command onto the events it causes.

    `correlation_id` ties together everything one client request set off (a fork and all of
    its children's events); `causation_id` is the message that directly caused this one.
    """

    correlation_id: UUID | None = None
    causation_id: UUID | None = None
    actor: str | None = None

    @classmethod
    def caused_by(cls, command: CommandEnvelope) -> MessageContext:
        """Context for the events a worker appends while handling `command`."""
        return cls(
            correlation_id=command.correlation_id or command.command_id,
            causation_id=command.command_id,
            actor=command.actor,
        )

    @classmethod
    def caused_by_event(cls, event: EventEnvelope | HasEnvelope) -> MessageContext:
        """Context for what a worker appends in reaction to an event (the snapshot worker's
        upload record): caused by that event, so its own event id is deterministic."""
        env = event if isinstance(event, EventEnvelope) else event.envelope
        return cls(
            correlation_id=env.correlation_id or env.event_id,
            causation_id=env.event_id,
            actor=env.actor,
        )


def derive_event_id(causation_id: UUID | None, aggregate_id: str, index: int) -> UUID:
    """Event ids derive from the command that caused them, so two workers deciding the same
    command append the *same* message and JetStream dedup stores it once."""
    if causation_id is None:
        return uuid4()
    return uuid5(_EVENT_ID_NS, f"{causation_id}/{aggregate_id}/{index}")


class Registry(Generic[M]):
    """Wire name ↔ model class, plus upcasters from older schema versions."""

    def __init__(self, types: Mapping[str, type[M]]) -> None:
        self._types = dict(types)
        self._upcasters: dict[tuple[str, int], Upcaster] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._types

    @property
    def types(self) -> Mapping[str, type[M]]:
        return self._types

    def name_of(self, message: M) -> str:
        name = type(message).__name__
        if self._types.get(name) is not type(message):
            raise DecodeError(f"{name} is not a registered message type")
        return name

    def version_of(self, name: str) -> int:
        return getattr(self._types[name], "schema_version", 1)

    def upcaster(self, name: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Register `fn` turning a `name` payload of `from_version` into `from_version + 1`."""

        def register(fn: Upcaster) -> Upcaster:
            self._upcasters[(name, from_version)] = fn
            return fn

        return register

    def load(self, name: str, version: int, payload: dict[str, Any]) -> M:
        """Validate a payload of any known version into the current model."""
        cls = self._types.get(name)
        if cls is None:
            raise DecodeError(f"unknown message type {name!r}")
        current = self.version_of(name)
        while version < current:
            step = self._upcasters.get((name, version))
            if step is None:
                raise DecodeError(f"no upcaster for {name} v{version}")
            payload, version = step(dict(payload)), version + 1
        try:
            return cls.model_validate(payload)
        except ValidationError as e:
            raise DecodeError(f"invalid {name} payload: {e}") from e


def _event_registry() -> Registry[Event]:
    registry = Registry(EVENT_TYPES)
    for (name, version), upcast in EVENT_UPCASTERS.items():
        registry.upcaster(name, version)(upcast)
    return registry


def _command_registry() -> Registry[Command]:
    return Registry(COMMAND_TYPES)


#: The process-wide registries (built from the domain's closed sets).
events: Registry[Event] = _event_registry()
commands: Registry[Command] = _command_registry()


def encode_event(
    event: Event,
    *,
    event_id: UUID,
    aggregate_id: str,
    aggregate_version: int,
    context: MessageContext,
) -> tuple[EventEnvelope, bytes]:
    name = events.name_of(event)
    env = EventEnvelope(
        event_id=event_id,
        type=name,
        schema_version=events.version_of(name),
        aggregate_id=aggregate_id,
        aggregate_version=aggregate_version,
        occurred_at=event.at,
        causation_id=context.causation_id,
        correlation_id=context.correlation_id,
        actor=context.actor,
        payload=event.model_dump(mode="json"),
    )
    return env, env.model_dump_json().encode()


def decode_event(data: bytes) -> tuple[EventEnvelope, Event]:
    try:
        env = EventEnvelope.model_validate_json(data)
    except ValidationError as e:
        raise DecodeError(f"not an event envelope: {e}") from e
    return env, events.load(env.type, env.schema_version, env.payload)


def encode_command(
    command: Command, *, aggregate_id: str, context: MessageContext
) -> tuple[CommandEnvelope, bytes]:
    name = commands.name_of(command)
    env = CommandEnvelope(
        command_id=command.command_id,
        type=name,
        schema_version=commands.version_of(name),
        aggregate_id=aggregate_id,
        issued_at=command.at,
        aggregate_kind=command.aggregate,
        causation_id=context.causation_id,
        correlation_id=context.correlation_id,
        actor=context.actor,
        payload=command.model_dump(mode="json"),
    )
    return env, env.model_dump_json().encode()


def decode_command_envelope(data: bytes) -> CommandEnvelope:
    try:
        return CommandEnvelope.model_validate_json(data)
    except ValidationError as e:
        raise DecodeError(f"not a command envelope: {e}") from e


def export_json_schema() -> dict[str, Any]:
    """JSON Schema of both envelopes and of every command and event payload (`aenv schema`)."""
    return {
        "envelopes": {
            "EventEnvelope": EventEnvelope.model_json_schema(),
            "CommandEnvelope": CommandEnvelope.model_json_schema(),
        },
        "commands": {
            name: {"schema_version": commands.version_of(name), "schema": cls.model_json_schema()}
            for name, cls in sorted(commands.types.items())
        },
        "events": {
            name: {"schema_version": events.version_of(name), "schema": cls.model_json_schema()}
            for name, cls in sorted(events.types.items())
        },
    }
