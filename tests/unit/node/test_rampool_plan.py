"""The RAM pool's bound (`rampool.plan_room`): which sources' copies go to make room for a
new one, least recently used first, and when a copy cannot be made at all."""

from __future__ import annotations

from workers.node.runtime.rampool import Held, plan_room

MIB = 1 << 20


def test_fits_without_dropping_anything() -> None:
    held = {"a": Held(100 * MIB, 1.0), "b": Held(100 * MIB, 2.0)}
    assert plan_room(held, budget=400 * MIB, need=150 * MIB, taker="c") == []


def test_drops_least_recently_used_first_until_it_fits() -> None:
    held = {"a": Held(100 * MIB, 3.0), "b": Held(100 * MIB, 1.0), "c": Held(100 * MIB, 2.0)}
    # 300 held + 150 needed, 350 allowed: one source must go, the oldest (b)
    assert plan_room(held, budget=350 * MIB, need=150 * MIB, taker="d") == ["b"]
    # 250 allowed: two go, oldest first
    assert plan_room(held, budget=250 * MIB, need=150 * MIB, taker="d") == ["b", "c"]


def test_the_taker_itself_is_never_dropped() -> None:
    held = {"a": Held(100 * MIB, 0.0), "b": Held(100 * MIB, 5.0)}
    # a is the oldest, but it is the one asking: b goes instead
    assert plan_room(held, budget=250 * MIB, need=100 * MIB, taker="a") == ["b"]


def test_nothing_is_dropped_for_a_copy_that_cannot_fit() -> None:
    held = {"a": Held(100 * MIB, 1.0), "b": Held(100 * MIB, 2.0)}
    assert plan_room(held, budget=100 * MIB, need=150 * MIB, taker="c") is None
    # the taker's own copies count: a second one of 100 MiB does not fit in 150
    assert plan_room(held, budget=150 * MIB, need=100 * MIB, taker="a") is None


def test_a_zero_budget_takes_nothing() -> None:
    assert plan_room({}, budget=0, need=1, taker="a") is None
    assert plan_room({}, budget=0, need=0, taker="a") == []


def test_ties_are_broken_by_name() -> None:
    held = {"b": Held(MIB, 1.0), "a": Held(MIB, 1.0)}
    assert plan_room(held, budget=MIB, need=MIB, taker="c") == ["a", "b"]


def test_the_result_always_fits() -> None:
    """Whatever the pool holds, the plan (when there is one) leaves room for the copy."""
    for budget in range(0, 1000, 37):
        for need in range(0, 400, 53):
            held = {f"s{i}": Held((i * 41) % 170, float((i * 7) % 11)) for i in range(12)}
            plan = plan_room(held, budget=budget, need=need, taker="s3")
            if plan is None:
                assert held["s3"].bytes + need > budget
                continue
            assert "s3" not in plan
            left = sum(h.bytes for k, h in held.items() if k not in plan)
            assert left + need <= budget
