"""Subject, stream and consumer names: one builder, prefixable, injection-safe."""

from __future__ import annotations

import pytest

from bus import COMMAND_VERBS, AggregateKind, BusSettings, DecodeError, InvalidName, Names
from bus.commands import aggregate_id_of, verb_of
from bus.subjects import carries, decode_id, encode_id
from domain import COMMAND_TYPES
from domain import sandbox as sb


def test_unprefixed_names_match_the_design() -> None:
    n = Names()
    assert (n.event_stream, n.command_stream, n.nodes_bucket) == (
        "AENV_EVT",
        "AENV_CMD",
        "aenv_nodes",
    )
    assert n.all_events == "aenv.evt.>"
    assert n.sandbox_events("abc") == "aenv.evt.sandbox.abc"
    assert n.events(AggregateKind.TEMPLATE, "base") == "aenv.evt.template.base"
    assert n.events_of_kind(AggregateKind.SANDBOX) == "aenv.evt.sandbox.*"
    assert n.node_command("n1", "pause") == "aenv.cmd.node.n1.pause"
    assert n.node_commands("n1") == "aenv.cmd.node.n1.*"
    assert n.place_command("create") == "aenv.cmd.place.create"
    assert n.node_consumer("n1") == "node-n1" and n.place_consumer == "place"
    assert n.aggregate_id_of(n.sandbox_events("xyz")) == "xyz"


def test_prefix_namespaces_everything() -> None:
    n = Names("t1234")
    assert n.event_stream == "T1234_AENV_EVT" and n.command_stream == "T1234_AENV_CMD"
    assert n.nodes_bucket == "t1234_aenv_nodes"
    assert n.sandbox_events("a") == "t1234.aenv.evt.sandbox.a"
    assert n.place_commands == "t1234.aenv.cmd.place.*"
    assert n.node_consumer("n") == "t1234_node-n" and n.durable("timer") == "t1234_timer"


@pytest.mark.parametrize("bad", ["a*", ">", "a b", "a\tb", ""])
def test_ids_cannot_inject_subject_tokens(bad: str) -> None:
    with pytest.raises(InvalidName):
        Names().sandbox_events(bad)
    with pytest.raises(InvalidName):
        Names().node_command(bad, "pause")
    assert not carries(bad)


@pytest.mark.parametrize(
    "aggregate_id",
    [
        "base",
        "my.tpl",
        "docker.io/library/python:3.12",
        "127.0.0.1:5000/cat/a:1",
        "app:0b6f3c1e-9a7e-4f0e-8a59-6d1f1f2b6a11",
        "a%2Eb",  # looks escaped already: must come back as written
        "%25%",
        "..",
    ],
)
def test_aggregate_ids_map_to_one_token_without_loss(aggregate_id: str) -> None:
    n = Names("t1")
    subject = n.events(AggregateKind.TEMPLATE, aggregate_id)
    assert subject.count(".") == 4  # prefix, aenv, evt, kind, one id token
    assert n.aggregate_id_of(subject) == aggregate_id
    assert Names.kind_of(subject) == "template" and carries(aggregate_id)


def test_ids_without_an_escaped_character_keep_their_old_subject() -> None:
    """Events written before the escape existed stay where their aggregate reads them."""
    assert Names().events(AggregateKind.TEMPLATE, "app:v1") == "aenv.evt.template.app:v1"
    assert encode_id("docker.io/x") == "docker%2Eio/x" and decode_id("docker%2Eio/x") == (
        "docker.io/x"
    )
    assert encode_id("my.tpl") != encode_id("my%2Etpl")


def test_prefix_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AENV_BUS_PREFIX", "t99")
    assert BusSettings().bus_prefix == "t99"
    with pytest.raises(ValueError):
        BusSettings(bus_prefix="Has.Dots")


def test_every_client_command_has_a_verb() -> None:
    assert set(COMMAND_VERBS) <= set(COMMAND_TYPES)
    assert verb_of(sb.PauseSandbox(sandbox_id="a")) == "pause"
    assert aggregate_id_of(sb.PauseSandbox(sandbox_id="a")) == "a"
    with pytest.raises(DecodeError):
        verb_of(sb.CompleteKill(sandbox_id="a"))  # node-internal, never on the bus
