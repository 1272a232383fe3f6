"""The lease timer's loop (`workers/timer/leases.py`): a tick that fails (the read model or
the bus away) is logged and the next tick runs — the task is not restarted, let alone the
role stopped, for a database blip; every step of a tick is idempotent."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest

from bus.bulk import Member
from domain import lease as ls
from workers.timer.leases import LeaseTimer


async def test_a_failed_tick_is_retried_by_the_next(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[datetime] = []
    timer: LeaseTimer

    async def due(now: datetime) -> list[ls.Lease]:
        calls.append(now)
        if len(calls) == 1:
            raise ConnectionError("database restarting")
        timer._stopping.set()  # two ticks are the test
        return []

    async def swept(_: datetime) -> list[ls.Lease]:
        return []

    async def members(_: str, __: str) -> list[Member]:
        return []

    bus: Any = object()  # a tick with nothing due and nothing ended never reaches the bus
    timer = LeaseTimer(bus, due=due, swept=swept, members=members, tick_s=0.01)
    await asyncio.wait_for(timer.run(), 5)
    assert len(calls) == 2
    assert "tick failed" in caplog.text and "database restarting" in caplog.text
