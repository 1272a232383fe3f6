"""The wire: the JSON envelopes commands and events travel in, checked against the schema
the server exports.

`schema.json` (beside this module) is `aenv schema`'s output, committed with the client:
the one description of every command and event, whose owner is the server's domain.
`tests/unit/pipeline/test_wire.py` fails when the server's schema and this copy differ
(regenerate it with `aenv schema > aenv_pipeline/schema.json`), when the envelope models
below stop matching the schema's envelopes, and when a command this client encodes is not
one the server decodes.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any
from uuid import UUID, uuid4

from pydantic import AwareDatetime, BaseModel, ConfigDict

__all__ = [
    "CommandEnvelope",
    "EventEnvelope",
    "InvalidCommand",
    "command_envelope",
    "schema",
    "validate_payload",
]


class InvalidCommand(ValueError):
    """A command the server would refuse as invalid, caught before it is published."""


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
    """An event as stored in the event stream (`AENV_EVT`)."""

    event_id: UUID
    aggregate_version: int
    occurred_at: AwareDatetime


class CommandEnvelope(_Envelope):
    """A command as queued in the command stream (`AENV_CMD`)."""

    command_id: UUID
    issued_at: AwareDatetime
    aggregate_kind: str | None = None


@cache
def schema() -> dict[str, Any]:
    """The server's exported JSON Schema (`aenv schema`) this client was built against."""
    text = resources.files(__package__).joinpath("schema.json").read_text(encoding="utf-8")
    doc: dict[str, Any] = json.loads(text)
    return doc


def _type_ok(value: Any, spec: dict[str, Any]) -> bool:
    if "anyOf" in spec:
        return any(_type_ok(value, s) for s in spec["anyOf"])
    kind = spec.get("type")
    if kind is None:
        return True  # a $ref or a free value: the server validates the rest
    checks: dict[str, Any] = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list | tuple),
        "null": lambda v: v is None,
    }
    if not checks[kind](value):
        return False
    if "enum" in spec and value not in spec["enum"]:
        return False
    return not (kind == "string" and "pattern" in spec and not re.search(spec["pattern"], value))


def validate_payload(command_type: str, payload: dict[str, Any]) -> None:
    """Check a command payload against the schema's top level: a known command, no unknown
    field, every required one, each value of its type, enum and pattern (nested values are
    the server's to judge: it answers a `CommandRejected` for those)."""
    entry = schema()["commands"].get(command_type)
    if entry is None:
        raise InvalidCommand(f"{command_type} is not a command of this aenv")
    doc = entry["schema"]
    props: dict[str, Any] = doc.get("properties", {})
    if doc.get("additionalProperties") is False and (unknown := set(payload) - set(props)):
        raise InvalidCommand(f"{command_type}: unknown fields {sorted(unknown)}")
    if missing := set(doc.get("required", ())) - set(payload):
        raise InvalidCommand(f"{command_type}: missing fields {sorted(missing)}")
    for name, value in payload.items():
        if not _type_ok(value, props[name]):
            raise InvalidCommand(f"{command_type}.{name}: {value!r} does not fit {props[name]}")


def command_envelope(
    command_type: str,
    aggregate_id: str,
    fields: dict[str, Any],
    *,
    command_id: UUID | None = None,
    actor: str | None = None,
) -> CommandEnvelope:
    """A sandbox command, validated, in its envelope: `fields` are the payload's own (the
    id and clock fields are added here)."""
    cid = command_id or uuid4()
    now = datetime.now(UTC)
    payload = {
        "command_id": str(cid),
        "at": now.isoformat(),
        "sandbox_id": aggregate_id,
        **{k: v for k, v in fields.items() if v is not None},
    }
    validate_payload(command_type, payload)
    return CommandEnvelope(
        type=command_type,
        schema_version=schema()["commands"][command_type]["schema_version"],
        aggregate_id=aggregate_id,
        aggregate_kind="sandbox",
        command_id=cid,
        issued_at=now,
        correlation_id=cid,
        actor=actor,
        payload=payload,
    )
