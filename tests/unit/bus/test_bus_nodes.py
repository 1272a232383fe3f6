"""When a node counts as gone: the API moves its paused sandboxes' resumes elsewhere."""

from __future__ import annotations

from bus.nodes import MISSED_BEATS, Heartbeat, is_gone


def beat(at: float, every: float = 5.0) -> Heartbeat:
    return Heartbeat(node_id="n1", at=at, every_s=every)


def test_no_heartbeat_at_all_is_gone() -> None:
    assert is_gone(None, 1000.0)


def test_a_late_beat_is_not_gone_yet() -> None:
    assert not is_gone(beat(1000.0), 1000.0 + 5.0 * (MISSED_BEATS - 0.5))


def test_missing_three_beats_is_gone_at_the_node_own_period() -> None:
    assert is_gone(beat(1000.0), 1000.0 + 5.0 * MISSED_BEATS + 0.1)
    assert is_gone(beat(1000.0, every=0.5), 1002.0)
    assert not is_gone(beat(1000.0, every=30.0), 1060.0)


def test_a_heartbeat_of_an_older_node_without_a_period_uses_the_default() -> None:
    old = Heartbeat.model_validate({"node_id": "n1", "at": 1000.0, "capacity": 4, "free": 4})
    assert old.every_s == 5.0 and not is_gone(old, 1010.0)
