"""A node never restores a stale local copy of a paused sandbox (`workers/node/openings.py`):
one this node paused, that was resumed elsewhere since and paused again there — found by
the rolling-upgrade test, where the node restored its older capture (the process's memory
rolled back by the time it ran on the other node)."""

from __future__ import annotations

from domain import sandbox as sb
from domain.sandbox import SandboxStatus as S
from workers.node.openings import stale_copy


def _paused(snapshot_id: str | None) -> sb.Sandbox:
    return sb.Sandbox.model_construct(
        sandbox_id="a", status=S.PAUSED, paused_snapshot_id=snapshot_id
    )


def test_the_capture_the_log_names_is_restored() -> None:
    assert not stale_copy(_paused("p2"), "p2")


def test_an_older_capture_held_here_is_stale() -> None:
    assert stale_copy(_paused("p2"), "p1")


def test_nothing_held_or_nothing_known_is_not_stale() -> None:
    assert not stale_copy(_paused("p2"), None)
    assert not stale_copy(None, "p1")  # an early start's guess: checked once the log answers
    assert not stale_copy(_paused(None), "p1")
