"""Which nodes the fleet's timer takes for gone for good: silent for `node_lost_after_s`
since their last beat, or absent from the bucket that long — and none while no node beats
at all, or before the timer has heard the bucket."""

from __future__ import annotations

from datetime import UTC, datetime

from bus import BusSettings
from bus.nodes import Heartbeat, NodeBook
from domain import sandbox as sb
from workers.timer import Timer


class _Bus:
    settings = BusSettings(node_lost_after_s=60)


def _timer(beats: dict[str, Heartbeat]) -> Timer:
    book = NodeBook(kv=None)  # type: ignore[arg-type]  # read from its mirror only
    book.beats, book._synced = beats, True
    t = Timer(bus=_Bus(), nodes=book)  # type: ignore[arg-type]
    for i, node in enumerate(("a", "b", "c")):
        t.load(
            [
                sb.Clock(
                    sandbox_id=f"s{i}",
                    status=sb.SandboxStatus.RUNNING,
                    node_id=node,
                    end_at=datetime(2030, 1, 1, tzinfo=UTC),
                )
            ]
        )
    return t


def _beat(node: str, at: float) -> Heartbeat:
    return Heartbeat(node_id=node, at=at, every_s=5)


def test_silence_counts_from_the_last_beat() -> None:
    t = _timer({"a": _beat("a", 1000), "b": _beat("b", 950), "c": _beat("c", 1000)})
    assert t.lost_nodes(1005) == []  # b: 55 s of silence
    assert t.lost_nodes(1011) == ["b"]  # b: 61 s


def test_a_node_missing_from_the_bucket_is_lost_once_missed_that_long() -> None:
    t = _timer({"a": _beat("a", 1000)})
    assert t.lost_nodes(1001) == []  # b and c first missed now
    t.nodes.beats["a"] = _beat("a", 1060)  # type: ignore[union-attr]
    assert sorted(t.lost_nodes(1062)) == ["b", "c"]


def test_a_node_beating_again_is_no_longer_missed() -> None:
    t = _timer({"a": _beat("a", 1000), "c": _beat("c", 1000)})
    assert t.lost_nodes(1001) == []
    t.nodes.beats.update(
        {
            "a": _beat("a", 1060),
            "b": _beat("b", 1060),  # type: ignore[union-attr]
            "c": _beat("c", 1060),
        }
    )
    assert t.lost_nodes(1062) == []


def test_nobody_is_lost_while_no_node_beats() -> None:
    t = _timer({"a": _beat("a", 0), "b": _beat("b", 0), "c": _beat("c", 0)})
    assert t.lost_nodes(10_000) == []


def test_nothing_before_the_mirror_is_filled() -> None:
    t = _timer({})
    t.nodes._synced = False  # type: ignore[union-attr]
    assert t.lost_nodes(10_000) == []
