"""A role's start tried again after a bus timeout before READY (`aenv.roles.startagain`),
never after it, never once stopping, and at most `START_TRIES` times."""

from __future__ import annotations

import asyncio

import pytest
from nats.errors import TimeoutError as NatsTimeout

from aenv.roles import common
from aenv.roles.startagain import START_TRIES, start_again


@pytest.fixture(autouse=True)
def not_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "_said_ready", False)


def _start(fails: int, *, ready_first: bool = False) -> tuple[list[int], object]:
    calls: list[int] = []

    async def start() -> None:
        calls.append(1)
        if ready_first:
            common.say(common.READY)
        if len(calls) <= fails:
            raise NatsTimeout()

    return calls, start


async def test_a_start_cut_by_a_bus_timeout_runs_again() -> None:
    calls, start = _start(fails=1)
    await start_again(start, asyncio.Event(), pause_s=0)  # type: ignore[arg-type]
    assert len(calls) == 2


async def test_it_gives_up_after_its_tries() -> None:
    calls, start = _start(fails=START_TRIES)
    with pytest.raises(NatsTimeout):
        await start_again(start, asyncio.Event(), pause_s=0)  # type: ignore[arg-type]
    assert len(calls) == START_TRIES


async def test_a_role_that_served_stops_as_before() -> None:
    calls, start = _start(fails=1, ready_first=True)
    with pytest.raises(NatsTimeout):
        await start_again(start, asyncio.Event(), pause_s=0)  # type: ignore[arg-type]
    assert len(calls) == 1


async def test_a_stopping_role_is_not_started_again() -> None:
    stop = asyncio.Event()
    stop.set()
    calls, start = _start(fails=1)
    with pytest.raises(NatsTimeout):
        await start_again(start, stop, pause_s=0)  # type: ignore[arg-type]
    assert len(calls) == 1


async def test_other_errors_are_not_retried() -> None:
    calls: list[int] = []

    async def start() -> None:
        calls.append(1)
        raise ValueError("a bad setting")

    with pytest.raises(ValueError):
        await start_again(start, asyncio.Event(), pause_s=0)
    assert len(calls) == 1
