"""Every aggregate kind is described once, in `domain.aggregates`; these tests check that
each registered kind is wired everywhere it must be — a subject kind, a typed store on
`Bus`, its messages in the wire registries and `aenv schema`, a projection folding it — so a
new kind cannot be half-registered."""

from __future__ import annotations

from typing import Any, cast

import pytest

from bus import AggregateKind, Bus, BusSettings, EventStore, Names, export_json_schema
from bus.connection import stores_of
from bus.envelope import commands, events
from domain import (
    AGGREGATES,
    COMMAND_TYPES,
    EVENT_TYPES,
    EVENT_UPCASTERS,
    Aggregate,
    CommandRejected,
    aggregate_of,
)
from projections import all_projections

KINDS = [a.kind for a in AGGREGATES]


def _offline_bus() -> Bus:
    """A `Bus` with its stores but no connection (building a store touches no server)."""
    nothing = cast(Any, None)
    settings = BusSettings()
    return Bus(
        nc=nothing,
        js=nothing,
        settings=settings,
        names=Names(),
        publisher=nothing,
        stores=stores_of(nothing, nothing, settings),
        commands=nothing,
    )


def test_the_kinds_are_the_subject_kinds_once_each() -> None:
    assert len(set(KINDS)) == len(KINDS)
    assert set(KINDS) == set(AggregateKind)


@pytest.mark.parametrize("aggregate", AGGREGATES, ids=lambda a: a.kind)
def test_a_kind_has_an_event_subject_family(aggregate: Aggregate[Any, Any, Any]) -> None:
    names = Names("t1")
    assert names.events(aggregate.kind, "x1") == f"t1.aenv.evt.{aggregate.kind.value}.x1"
    assert names.events_of_kind(aggregate.kind) == f"t1.aenv.evt.{aggregate.kind.value}.*"
    assert Names.kind_of(names.events(aggregate.kind, "x1")) == aggregate.kind
    assert aggregate_of(aggregate.kind.value) is aggregate


@pytest.mark.parametrize("aggregate", AGGREGATES, ids=lambda a: a.kind)
def test_a_kinds_commands_address_it_and_travel(aggregate: Aggregate[Any, Any, Any]) -> None:
    """A command's `aggregate` is where its events and rejection go: it must be its kind."""
    assert aggregate.commands
    for cls in aggregate.commands:
        assert (cls.aggregate, bool(cls.aggregate_field)) == (aggregate.kind, True), cls
        assert commands.types[cls.__name__] is cls


@pytest.mark.parametrize("aggregate", AGGREGATES, ids=lambda a: a.kind)
def test_a_kinds_events_can_be_stored_and_read(aggregate: Aggregate[Any, Any, Any]) -> None:
    assert aggregate.events
    for cls in aggregate.events:
        assert events.types[cls.__name__] is cls
    for name, _ in aggregate.upcasters:
        assert name in {cls.__name__ for cls in aggregate.events}


def test_every_wire_type_belongs_to_one_kind() -> None:
    owned_commands = [c.__name__ for a in AGGREGATES for c in a.commands]
    owned_events = [e.__name__ for a in AGGREGATES for e in a.events]
    assert sorted(owned_commands) == sorted(COMMAND_TYPES)
    assert sorted([*owned_events, CommandRejected.__name__]) == sorted(EVENT_TYPES)
    assert set(EVENT_UPCASTERS) == {k for a in AGGREGATES for k in a.upcasters}


def test_the_schema_export_lists_every_kinds_messages() -> None:
    schema = export_json_schema()
    for aggregate in AGGREGATES:
        assert {c.__name__ for c in aggregate.commands} <= set(schema["commands"])
        assert {e.__name__ for e in aggregate.events} <= set(schema["events"])


def test_the_bus_has_a_typed_store_for_every_kind() -> None:
    """Each kind's store is on `Bus` under a name of its own (`bus.sandboxes`, …), and is a
    rejection sink for the commands addressed to that kind."""
    bus = _offline_bus()
    named = {
        name: getattr(bus, name)
        for name, attr in vars(Bus).items()
        if isinstance(attr, property) and name != "rejection_sinks"
    }
    by_kind = {store.kind: store for store in named.values() if isinstance(store, EventStore)}
    assert sorted(by_kind) == sorted(KINDS)
    for aggregate in AGGREGATES:
        store = bus.store(aggregate)
        assert by_kind[aggregate.kind] is store
        assert (store.kind, store.evolve, store.decide) == (
            aggregate.kind,
            aggregate.evolve,
            aggregate.decide,
        )
        assert bus.rejection_sinks[aggregate.kind] is store


def test_every_kind_is_folded_by_one_projection() -> None:
    folded = [p.kind for p in all_projections()]
    assert sorted(folded) == sorted(KINDS)
