"""The envelope: round trips, upcasting, schema export, context propagation."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest

from bus import DecodeError, MessageContext, Registry, export_json_schema
from bus.commands import decode_command
from bus.envelope import decode_event, derive_event_id, encode_command, encode_event
from domain import COMMAND_TYPES, EVENT_TYPES, Event
from domain import sandbox as sb

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_event_round_trip() -> None:
    [e] = sb.decide(
        None, sb.CreateSandbox(sandbox_id="s1", template_id="base", at=T0, metadata={"k": "v"})
    )
    ctx = MessageContext(uuid4(), uuid4(), "apikey:k1")
    env, data = encode_event(
        e, event_id=uuid4(), aggregate_id="s1", aggregate_version=1, context=ctx
    )
    wire = json.loads(data)
    assert set(wire) == {
        "event_id",
        "type",
        "schema_version",
        "aggregate_id",
        "aggregate_version",
        "occurred_at",
        "causation_id",
        "correlation_id",
        "actor",
        "payload",
    }
    assert wire["type"] == "SandboxRequested" and wire["occurred_at"].startswith("2026-01-01")
    env2, e2 = decode_event(data)
    assert env2 == env and e2 == e


def test_command_round_trip_and_context() -> None:
    c = sb.ForkSandbox(sandbox_id="s1", count=3, at=T0)
    _, data = encode_command(c, aggregate_id="s1", context=MessageContext(actor="pipeline"))
    env2, c2 = decode_command(data)
    assert c2 == c and env2.command_id == c.command_id and env2.actor == "pipeline"
    ctx = MessageContext.caused_by(env2)
    assert ctx.causation_id == c.command_id and ctx.correlation_id == c.command_id


def test_event_ids_derive_from_the_cause() -> None:
    cause = uuid4()
    assert derive_event_id(cause, "s", 0) == derive_event_id(cause, "s", 0)
    assert derive_event_id(cause, "s", 0) != derive_event_id(cause, "s", 1)
    assert derive_event_id(None, "s", 0) != derive_event_id(None, "s", 0)


def test_unknown_type_and_bad_payload_are_decode_errors() -> None:
    with pytest.raises(DecodeError):
        decode_event(b"not json")
    [e] = sb.decide(None, sb.CreateSandbox(sandbox_id="s1", template_id="base", at=T0))
    _, data = encode_event(
        e, event_id=uuid4(), aggregate_id="s1", aggregate_version=1, context=MessageContext()
    )
    wire = json.loads(data)
    with pytest.raises(DecodeError):
        decode_event(json.dumps({**wire, "type": "Nope"}).encode())
    with pytest.raises(DecodeError):
        decode_event(json.dumps({**wire, "payload": {"sandbox_id": "s1"}}).encode())


class Renamed(Event):
    """v2 of an imaginary event that renamed `old` to `new` (v1 → v2 upcast)."""

    schema_version = 2
    new: str


def test_upcasting_old_versions() -> None:
    reg: Registry[Event] = Registry({"Renamed": Renamed})

    @reg.upcaster("Renamed", 1)
    def v1_to_v2(p: dict[str, Any]) -> dict[str, Any]:
        return {"at": p["at"], "new": p["old"]}

    at = T0.isoformat()
    assert reg.load("Renamed", 1, {"old": "x", "at": at}) == Renamed(new="x", at=T0)
    assert reg.load("Renamed", 2, {"new": "y", "at": at}) == Renamed(new="y", at=T0)
    # newer writers than us: unknown fields are ignored, not fatal
    assert reg.load("Renamed", 3, {"new": "z", "at": at, "extra": 1}) == Renamed(new="z", at=T0)
    with pytest.raises(DecodeError):  # no upcaster registered for v1
        Registry({"Renamed": Renamed}).load("Renamed", 1, {"old": "x", "at": at})


def test_json_schema_covers_every_message() -> None:
    schema = export_json_schema()
    assert set(schema["commands"]) == set(COMMAND_TYPES)
    assert set(schema["events"]) == set(EVENT_TYPES)
    create = schema["commands"]["CreateSandbox"]["schema"]
    assert "template_id" in create["required"] and create["additionalProperties"] is False
    assert "payload" in schema["envelopes"]["EventEnvelope"]["properties"]
    json.dumps(schema)  # serialisable as is
