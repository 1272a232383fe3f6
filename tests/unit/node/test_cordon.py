"""A cordoned node passes on what placement offers it (`workers/node/cordon.py`): creates
and resumes any node may take; a fork's children and its own commands stay its work."""

from __future__ import annotations

from workers.node.cordon import refuses


def test_a_node_not_cordoned_refuses_nothing() -> None:
    assert not refuses(False, placed=True, forked=False)


def test_a_cordoned_node_passes_placed_work_on() -> None:
    assert refuses(True, placed=True, forked=False)


def test_a_cordoned_node_keeps_its_own_commands_and_fork_children() -> None:
    assert not refuses(True, placed=False, forked=False)  # a pause, kill, its own resume
    assert not refuses(True, placed=True, forked=True)


def test_placed_work_is_told_by_its_subject() -> None:
    from bus.subjects import Names

    names = Names("t1")
    assert names.is_placed(names.place_command("create"))
    assert not names.is_placed(names.node_command("n1", "resume"))
