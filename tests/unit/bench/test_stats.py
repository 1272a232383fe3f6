"""The benchmarks' shift estimate: robust where a difference of medians is not."""

from __future__ import annotations

import random
import statistics

from bench.stats import shift


def test_shift_of_a_constant_offset_is_that_offset() -> None:
    base = [0.2 + 0.001 * i for i in range(30)]
    assert shift([x + 0.012 for x in base], base) == 12.0


def test_shift_holds_where_medians_of_bimodal_samples_jump() -> None:
    """Restore times with two modes 100 ms apart, picked at random: an offset of 10 ms is
    recovered within a few ms by the shift estimate in every draw, while the difference of
    the two medians is off by tens of ms in many of them."""
    rng = random.Random(7)

    def draw(n: int) -> list[float]:
        return [rng.choice((0.25, 0.35)) + rng.gauss(0, 0.01) for _ in range(n)]

    worst_shift, worst_medians = 0.0, 0.0
    for _ in range(200):
        raw, api = draw(30), [x + 0.010 for x in draw(30)]
        est = shift(api, raw)
        assert est is not None
        worst_shift = max(worst_shift, abs(est - 10))
        medians = (statistics.median(api) - statistics.median(raw)) * 1000
        worst_medians = max(worst_medians, abs(medians - 10))
    assert worst_shift < worst_medians / 2
    assert worst_medians > 30


def test_no_samples_no_estimate() -> None:
    assert shift([], [0.1]) is None
