"""Supervised background tasks (`bus.supervised`): the pure restart-or-give-up decision, and
the plumbing on a real event loop — a task that raises (an armed failpoint) is restarted
and counted, one cancelled from outside likewise, one that keeps dying goes to the give-up
handler, and its owner's stop ends it without a restart."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bus import failpoints, supervised
from bus.failpoints import FailpointError, failpoint
from bus.supervised import GiveUp, Restart, RestartPolicy, TaskGaveUp, on_death, supervise
from bus.tasks import cancel_and_wait

FAST = RestartPolicy(deaths=3, window_s=10.0, first_delay_s=0.01, cap_s=0.04)


# ---- the decision -------------------------------------------------------------------
def test_first_death_restarts_after_the_first_delay() -> None:
    deaths, decision = on_death((), 100.0, FAST)
    assert deaths == (100.0,)
    assert decision == Restart(0.01)


def test_delay_doubles_with_each_death_in_the_window_up_to_the_cap() -> None:
    policy = RestartPolicy(deaths=10, window_s=60.0, first_delay_s=0.5, cap_s=3.0)
    deaths: tuple[float, ...] = ()
    delays = []
    for t in range(6):
        deaths, decision = on_death(deaths, float(t), policy)
        assert isinstance(decision, Restart)
        delays.append(decision.delay_s)
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_gives_up_at_n_deaths_within_the_window() -> None:
    deaths: tuple[float, ...] = ()
    decisions = []
    for t in (0.0, 1.0, 2.0):
        deaths, decision = on_death(deaths, t, FAST)
        decisions.append(decision)
    assert isinstance(decisions[0], Restart) and isinstance(decisions[1], Restart)
    assert decisions[2] == GiveUp("3 deaths within 10 s")


def test_deaths_older_than_the_window_are_forgiven() -> None:
    """A task dying now and then (once in a while, for ever) is restarted for ever."""
    deaths: tuple[float, ...] = ()
    for t in range(0, 200, 6):  # 2 deaths per 10 s window at most
        deaths, decision = on_death(deaths, float(t), FAST)
        assert isinstance(decision, Restart)
        assert len(deaths) <= 2


def test_default_policy_gives_up_well_before_a_node_is_taken_for_lost() -> None:
    """A heartbeat dying at once each time: the role goes down long before the timer's
    60 s (`AENV_NODE_LOST_AFTER_S`) — restarted by its supervisor, not left beatless."""
    deaths: tuple[float, ...] = ()
    now = 0.0
    while True:
        deaths, decision = on_death(deaths, now)
        if isinstance(decision, GiveUp):
            break
        now += decision.delay_s
    assert now < 10.0


# ---- the plumbing, on a real loop ---------------------------------------------------
@pytest.fixture
def armed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A failpoints file for this test (empty: nothing armed), read at once when written."""
    path = tmp_path / "failpoints"
    monkeypatch.setenv(failpoints.ENV, str(path))
    monkeypatch.setattr(failpoints, "CHECK_EVERY_S", 0.0)
    failpoints.reset()
    yield path
    failpoints.reset()


@pytest.fixture
def gave_up() -> Iterator[list[tuple[str, BaseException]]]:
    calls: list[tuple[str, BaseException]] = []
    supervised.on_give_up(lambda task, error: calls.append((task, error)))
    yield calls
    supervised.on_give_up(None)


async def test_a_task_that_raises_is_restarted_and_counted(armed: Path) -> None:
    armed.write_text("unit.beat=2\n")  # the beat raises twice, then beats on
    beats: list[int] = []
    runs = 0

    async def beat_forever() -> None:
        nonlocal runs
        runs += 1
        while True:
            failpoint("unit.beat")
            beats.append(runs)
            await asyncio.sleep(0.001)

    before = supervised.restarts().get("unit-heartbeat", 0)
    task = supervise("unit-heartbeat", beat_forever, policy=FAST)
    try:
        await _until(lambda: len(beats) >= 5)
        assert runs == 3  # two deaths, two restarts, beating since
        assert not task.done()
        assert supervised.restarts()["unit-heartbeat"] - before == 2
    finally:
        await cancel_and_wait(task)


async def test_a_task_cancelled_from_outside_is_restarted() -> None:
    """Cancelled by anything but its owner's stop: a death like a raise."""
    started: list[asyncio.Task[object] | None] = []

    async def work() -> None:
        started.append(asyncio.current_task())
        await asyncio.sleep(3600)

    task = supervise("unit-cancelled", work, policy=FAST)
    try:
        await _until(lambda: len(started) == 1)
        inner = started[0]
        assert inner is not None
        inner.cancel()  # e.g. a library's stray cancel of the task it runs in
        await _until(lambda: len(started) == 2)
        assert not task.done()
    finally:
        await cancel_and_wait(task)


async def test_a_task_that_keeps_dying_goes_to_the_give_up_handler(
    armed: Path, gave_up: list[tuple[str, BaseException]]
) -> None:
    armed.write_text("unit.always\n")
    runs = 0

    async def work() -> None:
        nonlocal runs
        runs += 1
        failpoint("unit.always")

    task = supervise("unit-broken", work, policy=FAST)
    await asyncio.wait_for(task, 5)
    assert runs == FAST.deaths
    assert [name for name, _ in gave_up] == ["unit-broken"]
    assert isinstance(gave_up[0][1], FailpointError)


async def test_without_a_handler_the_task_ends_with_task_gave_up(armed: Path) -> None:
    armed.write_text("unit.always\n")

    async def work() -> None:
        failpoint("unit.always")

    task = supervise("unit-no-handler", work, policy=FAST)
    with pytest.raises(TaskGaveUp):
        await asyncio.wait_for(task, 5)


async def test_the_owners_stop_cancels_the_work_without_a_restart() -> None:
    runs = 0
    cancelled = asyncio.Event()

    async def work() -> None:
        nonlocal runs
        runs += 1
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = supervise("unit-stopped", work, policy=FAST)
    await _until(lambda: runs == 1)
    await cancel_and_wait(task)
    assert task.cancelled() and cancelled.is_set() and runs == 1


async def test_a_task_that_returns_is_done() -> None:
    """A loop that saw its own stop flag returns: nothing to restart."""

    async def work() -> None:
        return

    task = supervise("unit-returns", work, policy=FAST)
    await asyncio.wait_for(task, 5)
    assert task.result() is None


async def _until(cond: object, timeout: float = 5.0) -> None:
    assert callable(cond)
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.005)
