"""The supervisor's restart policy: it never gives up, it slows down, and a long run forgives."""

from __future__ import annotations

from aenv.backoff import CrashRecord, restart_delay


def test_delay_doubles_up_to_the_cap_and_never_gives_up() -> None:
    delays = [restart_delay(n, first_s=0.5, cap_s=30) for n in range(1, 12)]
    assert delays[:4] == [0.5, 1.0, 2.0, 4.0]
    assert delays[-1] == 30
    assert delays == sorted(delays)
    assert restart_delay(10_000, cap_s=30) == 30  # no overflow, no "give up"


def test_a_stable_run_resets_the_streak() -> None:
    rec = CrashRecord(cap_s=30, stable_s=60)
    rec.started(0.0)
    assert rec.crashed(1.0) == 0.5
    rec.started(2.0)
    assert rec.crashed(3.0) == 1.0
    rec.started(4.0)
    assert rec.crashed(100.0) == 0.5  # ran 96 s: healthy, the streak starts again
    assert (rec.streak, rec.total) == (1, 3)


def test_a_crash_during_start_up_counts_against_the_streak() -> None:
    rec = CrashRecord(cap_s=4, stable_s=60)
    assert [rec.crashed(t) for t in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
