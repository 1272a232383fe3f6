"""The warm pool's sizing: a watermark of recent demand, a floor, caps and the budget."""

from __future__ import annotations

from domain import template as tp
from workers.node.warmsize import Demand, WarmPolicy, targets, wanted, warmable

BASE = 512


def _demand(**kw: object) -> Demand:
    return Demand(WarmPolicy(**kw))  # type: ignore[arg-type]


def test_a_kept_template_has_its_floor_before_any_create() -> None:
    d = _demand(keep=frozenset({"base"}))
    assert targets(d, {"base": BASE}, 0.0, spare_mib=10_000) == {"base": 1}


def test_nothing_is_warm_without_demand_or_keep() -> None:
    assert targets(_demand(), {"base": BASE}, 0.0, spare_mib=10_000) == {}


def test_the_target_follows_the_peak_of_a_window() -> None:
    d = _demand(window_s=5.0, max_per_template=16, budget_mib=100_000)
    for i in range(12):  # a burst of 12 within one second
        d.record("t", 100.0 + i * 0.05)
    d.record("t", 110.0)  # and one more much later
    assert wanted(d, "t", 111.0) == 12
    assert targets(d, {"t": BASE}, 111.0, spare_mib=100_000) == {"t": 12}


def test_creates_spread_out_want_only_the_floor() -> None:
    d = _demand(window_s=5.0)
    for i in range(10):
        d.record("t", i * 10.0)  # one create every 10 s
    assert wanted(d, "t", 95.0) == 1


def test_a_burst_is_forgotten_after_the_history_then_the_template_decays_to_nothing() -> None:
    d = _demand(window_s=5.0, history_s=120.0, idle_s=600.0, max_per_template=16)
    for i in range(8):
        d.record("t", i * 0.1)
    assert wanted(d, "t", 1.0) == 8
    assert wanted(d, "t", 200.0) == 1  # the burst left the history; still in use: floor
    assert wanted(d, "t", 700.0) == 0  # idle beyond idle_s


def test_a_kept_template_decays_to_its_floor_not_to_zero() -> None:
    d = _demand(keep=frozenset({"base"}), idle_s=60.0)
    for i in range(5):
        d.record("base", i * 0.1)
    assert wanted(d, "base", 1.0) == 5
    assert wanted(d, "base", 10_000.0) == 1


def test_the_per_template_cap_holds() -> None:
    d = _demand(max_per_template=4, budget_mib=100_000)
    for i in range(30):
        d.record("t", i * 0.01)
    assert targets(d, {"t": BASE}, 1.0, spare_mib=100_000) == {"t": 4}


def test_the_budget_and_the_spare_room_bound_the_pool() -> None:
    d = _demand(max_per_template=16, budget_mib=2048)
    for i in range(16):
        d.record("t", i * 0.01)
    assert targets(d, {"t": BASE}, 1.0, spare_mib=100_000) == {"t": 4}  # 2048 / 512
    assert targets(d, {"t": BASE}, 1.0, spare_mib=1100) == {"t": 2}  # the sandboxes' room
    assert targets(d, {"t": BASE}, 1.0, spare_mib=100) == {}


def test_every_template_in_use_gets_its_floor_before_a_burst_gets_more() -> None:
    d = _demand(max_per_template=16, budget_mib=2048)
    for i in range(16):
        d.record("burst", 50.0 + i * 0.01)
    d.record("quiet", 10.0)
    got = targets(d, {"burst": BASE, "quiet": BASE}, 51.0, spare_mib=100_000)
    assert got == {"burst": 3, "quiet": 1}


def test_a_template_without_a_known_size_is_skipped() -> None:
    d = _demand(keep=frozenset({"base"}))
    d.record("gone", 1.0)
    assert targets(d, {"base": BASE}, 2.0, spare_mib=10_000) == {"base": 1}


def test_forget_drops_the_demand() -> None:
    d = _demand()
    d.record("t", 1.0)
    d.forget("t")
    assert targets(d, {"t": BASE}, 2.0, spare_mib=10_000) == {}


def test_a_create_is_passed_on_only_to_nodes_said_to_hold_a_warm_vm() -> None:
    from workers.node.warmsize import passes_on

    assert passes_on(("b",), "a", held=0)  # b would hand one over; a would restore cold
    assert not passes_on(("b",), "a", held=1)  # a has one too: it takes it
    assert not passes_on(("a", "b"), "a", held=0)  # a was said to have one: it takes it
    assert not passes_on((), "a", held=0)  # nobody warm: whoever pulls takes it


def test_a_paused_capture_lent_to_fork_children_is_never_warmed() -> None:
    assert warmable("base") and warmable("my-template")
    assert not warmable(tp.paused_capture_template("c0ffee"))
