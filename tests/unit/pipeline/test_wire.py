"""The client's wire is the server's: its schema copy is `aenv schema`'s output, its
envelopes are the server's, and what it encodes the server decodes."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest

from aenv_pipeline import wire
from bus.commands import decode_command
from bus.envelope import CommandEnvelope, EventEnvelope, export_json_schema
from domain import sandbox as sb


def test_the_shipped_schema_is_the_servers() -> None:
    assert wire.schema() == export_json_schema(), (
        "aenv_pipeline/schema.json is stale: `aenv schema > aenv_pipeline/schema.json`"
    )


def _shape(doc: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A model's fields and required ones, without the docs (titles, descriptions)."""
    props = {k: {f: v for f, v in p.items() if f != "title"} for k, p in doc["properties"].items()}
    return props, sorted(doc.get("required", []))


@pytest.mark.parametrize(
    ("client", "server"),
    [(wire.CommandEnvelope, CommandEnvelope), (wire.EventEnvelope, EventEnvelope)],
)
def test_the_envelopes_are_the_servers(client: type[Any], server: type[Any]) -> None:
    assert _shape(client.model_json_schema()) == _shape(server.model_json_schema())
    assert _shape(client.model_json_schema()) == _shape(wire.schema()["envelopes"][server.__name__])


def test_a_create_the_client_encodes_decodes_on_the_server() -> None:
    env = wire.command_envelope(
        "CreateSandbox",
        "abc123",
        {"template_id": "base", "team_id": "t1", "metadata": {"run": "r1"}, "cpu_count": None},
        actor="pipeline:t1",
    )
    server_env, command = decode_command(env.model_dump_json().encode())
    assert isinstance(command, sb.CreateSandbox)
    assert command.sandbox_id == "abc123" and command.team_id == "t1"
    assert command.metadata == {"run": "r1"} and command.cpu_count == 2  # None: the default
    assert server_env.command_id == command.command_id == env.command_id
    assert server_env.kind == "sandbox" and server_env.actor == "pipeline:t1"


@pytest.mark.parametrize(
    ("name", "fields", "cls"),
    [
        ("KillSandbox", {}, sb.KillSandbox),
        ("PauseSandbox", {"keep_memory": False}, sb.PauseSandbox),
    ],
)
def test_node_commands_decode_on_the_server(
    name: str, fields: dict[str, Any], cls: type[Any]
) -> None:
    cid = uuid4()
    env = wire.command_envelope(name, "s1", fields, command_id=cid)
    _, command = decode_command(env.model_dump_json().encode())
    assert isinstance(command, cls) and command.command_id == cid


@pytest.mark.parametrize(
    ("name", "fields", "why"),
    [
        ("CreateSandbox", {"template_id": "base", "colour": "red"}, "unknown fields"),
        ("CreateSandbox", {"team_id": "t"}, "missing fields"),
        ("CreateSandbox", {"template_id": "base", "timeout_s": "long"}, "timeout_s"),
        ("KillSandbox", {"reason": "boredom"}, "reason"),
        ("LaunchRocket", {}, "not a command"),
    ],
)
def test_invalid_commands_are_refused_before_publishing(
    name: str, fields: dict[str, Any], why: str
) -> None:
    with pytest.raises(wire.InvalidCommand, match=why):
        wire.command_envelope(name, "s1", fields)


def test_an_id_the_server_refuses_is_refused_here() -> None:
    with pytest.raises(wire.InvalidCommand, match="sandbox_id"):
        wire.command_envelope("KillSandbox", "Not.An.Id", {})
