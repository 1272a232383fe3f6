"""The node aggregate (`domain/node.py`): a cordon is decided once, folded into state the
node and the API read, and undone by an uncordon; asking twice decides nothing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from domain import CommandRejected, CorruptHistory
from domain import node as nd
from domain import sandbox as sb

AT = datetime(2026, 12, 7, 1, 0, tzinfo=UTC)


def _run(state: nd.Node | None, *commands: nd.AnyNodeCommand) -> tuple[nd.Node | None, list[str]]:
    """Decide each command on the state the previous ones left; the events' names."""
    names: list[str] = []
    for c in commands:
        events = nd.decide_node(state, c)
        names += [type(e).__name__ for e in events]
        state = nd.fold_node(events, state)
    return state, names


def test_a_node_never_addressed_is_not_cordoned() -> None:
    assert not nd.is_cordoned(None)
    assert nd.decide_node(None, nd.UncordonNode(node_id="n1")) == []


def test_cordon_folds_into_a_cordoned_node_with_its_reason_and_time() -> None:
    state, names = _run(None, nd.CordonNode(node_id="n1", reason="drain", at=AT))
    assert names == ["NodeCordoned"]
    assert state == nd.Node(node_id="n1", cordoned=True, reason="drain", cordoned_at=AT)
    assert nd.is_cordoned(state)


def test_cordon_and_uncordon_are_idempotent() -> None:
    state, names = _run(
        None,
        nd.CordonNode(node_id="n1"),
        nd.CordonNode(node_id="n1", reason="again"),  # already cordoned: nothing
        nd.UncordonNode(node_id="n1"),
        nd.UncordonNode(node_id="n1"),  # already uncordoned: nothing
        nd.CordonNode(node_id="n1", reason="upgrade"),
    )
    assert names == ["NodeCordoned", "NodeUncordoned", "NodeCordoned"]
    assert state is not None and state.cordoned and state.reason == "upgrade"


def test_uncordon_clears_the_reason_and_time() -> None:
    state, _ = _run(
        None, nd.CordonNode(node_id="n1", reason="x", at=AT), nd.UncordonNode(node_id="n1")
    )
    assert state == nd.Node(node_id="n1")


def test_a_rejection_changes_nothing_and_a_foreign_event_is_corrupt_history() -> None:
    state, _ = _run(None, nd.CordonNode(node_id="n1"))
    rejected = CommandRejected(
        aggregate_id="n1",
        command_id=sb.derived_command_id("x"),
        command_type="CordonNode",
        code="invalid",
        reason="no",
        at=AT,
    )
    assert nd.evolve_node(state, rejected) == state
    with pytest.raises(CorruptHistory):
        nd.evolve_node(state, sb.SandboxKilled(sandbox_id="s1", at=AT))


def test_cordon_commands_address_the_node_kind() -> None:
    cmd = nd.CordonNode(node_id="n-1")
    assert (cmd.aggregate, cmd.aggregate_id) == ("node", "n-1")
