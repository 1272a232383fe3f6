"""The client's names are `bus.subjects.Names`' (their one owner), for any prefix."""

from __future__ import annotations

import pytest

from aenv_pipeline.names import VERBS, Names
from bus.subjects import COMMAND_VERBS
from bus.subjects import Names as BusNames


@pytest.mark.parametrize("prefix", ["", "t1", "tabc123"])
def test_names_match_the_servers(prefix: str) -> None:
    ours, theirs = Names(prefix), BusNames(prefix)
    assert ours.event_stream == theirs.event_stream
    assert ours.command_stream == theirs.command_stream
    assert ours.sandbox_events_all == theirs.events_of_kind(theirs_kind())
    for sid in ("abc", "my.tpl", "a%b"):
        assert ours.sandbox_events(sid) == theirs.sandbox_events(sid)
        assert ours.aggregate_id_of(ours.sandbox_events(sid)) == sid
    for team in ("default", "team-a_1"):
        assert ours.team_stream(team) == theirs.team_stream(team)
        assert ours.inbox(team) == theirs.inbox(team)
        assert ours.feed(team, "a.b") == theirs.feed(team, "a.b")
        assert ours.feed(team, None).startswith(theirs.team_feed(team)[:-1])
        for verb in VERBS.values():
            assert ours.ingress(team, verb) == theirs.ingress(team, verb)
    assert ours.inbox(None) == theirs.inbox(None)
    assert ours.feed_stream == theirs.feed_stream
    for verb in VERBS.values():
        assert ours.place_command(verb) == theirs.place_command(verb)
        assert ours.node_command("n1", verb) == theirs.node_command("n1", verb)


def theirs_kind():  # type: ignore[no-untyped-def]
    from bus.subjects import AggregateKind

    return AggregateKind.SANDBOX


def test_verbs_are_the_servers() -> None:
    assert {k: COMMAND_VERBS[k] for k in VERBS} == VERBS
