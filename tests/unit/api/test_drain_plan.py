"""A drain step's pure part (`api/drain.py`): which sandboxes it pauses now, and the
progress it reports — done only when every sandbox on the node is paused and durable."""

from __future__ import annotations

from api.drain import Held, progress, to_pause
from domain.sandbox import SandboxStatus as S


def test_only_running_sandboxes_are_paused_now() -> None:
    held = [
        Held("a", S.RUNNING, False),
        Held("b", S.PAUSING, False),
        Held("c", S.PAUSED, False),
        Held("d", S.SNAPSHOTTING, False),  # paused by a later step, once it runs
        Held("e", S.RUNNING, False),
    ]
    assert to_pause(held) == ["a", "e"]


def test_progress_counts_paused_and_durable_and_what_waits() -> None:
    held = [
        Held("a", S.RUNNING, False),
        Held("b", S.PAUSED, False),  # its upload under way
        Held("c", S.PAUSED, True),
    ]
    p = progress("n1", held)
    assert (p.total, p.durable, p.running, p.uploading, p.done) == (3, 1, 1, 1, False)
    assert p.waiting == ("a", "b")
    assert p.wire() == {
        "nodeID": "n1",
        "sandboxes": 3,
        "durable": 1,
        "running": 1,
        "uploading": 1,
        "waiting": ["a", "b"],
        "done": False,
    }


def test_done_once_every_sandbox_is_paused_and_durable() -> None:
    assert progress("n1", [Held("a", S.PAUSED, True), Held("b", S.PAUSED, True)]).done
    assert progress("n1", []).done  # an empty node is drained
    # a paused sandbox whose capture is durable but that runs again is not done
    assert not progress("n1", [Held("a", S.RUNNING, True)]).done
