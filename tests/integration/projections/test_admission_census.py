"""Admission control (`api/admission.py`, issue 32) against a real read model (Postgres)
and a real token bucket (NATS KV), without a stack: what a team has running is counted
from the table plus what this API admitted that the table does not show yet; concurrent
requests of one team never pass the limit together; a stale count admits but never
refuses; the rate is the bucket's. Rows are written as the sandboxes projection writes
them (its own tests check it folds events into them)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import delete, insert, update
from sqlalchemy.ext.asyncio import AsyncEngine

from api.admission import admitted
from api.auth import Caller, KeyChecker
from api.context import ApiContext, ApiSettings
from api.errors import ApiError
from bench.admission_bench import census_row
from bus import Bus
from projections.tables import sandboxes


@pytest_asyncio.fixture(autouse=True)
async def _clean(engine: AsyncEngine) -> AsyncIterator[None]:
    """The rows written here are in no log: gone before the rebuild test compares the live
    tables with a rebuild (the database is the session's)."""
    yield
    async with engine.begin() as conn:
        await conn.execute(delete(sandboxes).where(sandboxes.c.team_id.like("team-%")))


async def _rows(engine: AsyncEngine, *rows: dict[str, Any]) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(sandboxes), list(rows))


async def _set(engine: AsyncEngine, sid: str, status: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            update(sandboxes).where(sandboxes.c.sandbox_id == sid).values(status=status)
        )


def _ctx(bus: Bus, engine: AsyncEngine, **settings: Any) -> ApiContext:
    return ApiContext(
        bus=bus, engine=engine, settings=ApiSettings(**settings), keys=KeyChecker(engine)
    )


def _team() -> tuple[str, Caller]:
    team = f"team-{secrets.token_hex(3)}"
    return team, Caller(key_id=f"k-{team}", team_id=team)


async def _try(ctx: ApiContext, caller: Caller, sid: str) -> ApiError | None:
    try:
        async with admitted(ctx, caller, (sid,)):
            return None
    except ApiError as e:
        return e


async def test_running_counts_the_table_and_what_was_admitted_since(
    bus: Bus, engine: AsyncEngine
) -> None:
    team, caller = _team()
    ctx = _ctx(bus, engine, team_max_sandboxes=3)
    await _rows(
        engine,
        census_row(f"{team}r1", team, "running", end_in_s=7.5),
        census_row(f"{team}r2", team, "creating"),
        census_row(f"{team}k1", team, "killed"),
        census_row(f"{team}p1", team, "paused"),
    )
    assert await _try(ctx, caller, f"{team}n1") is None  # 2 + 1: admitted, and held
    refused = await _try(ctx, caller, f"{team}n2")  # the table does not show n1 yet
    assert refused is not None and refused.status == 429
    assert "has 3 sandboxes running and may have 3 (AENV_TEAM_MAX_SANDBOXES)" in refused.message
    assert refused.headers["Retry-After"] == "8"  # r1's TTL ends in 7.5 s
    await _rows(engine, census_row(f"{team}n1", team, "running"))  # now the table has it: once
    refused = await _try(ctx, caller, f"{team}n2")
    assert refused is not None and "has 3 sandboxes" in refused.message
    await _set(engine, f"{team}r2", "killed")  # a slot frees: the refusal path reads again
    assert await _try(ctx, caller, f"{team}n2") is None
    # a resume of the paused one needs a running slot too: r1, n1 and n2 (held) hold them
    with pytest.raises(ApiError, match="has 3 sandboxes running"):
        async with admitted(ctx, caller, (f"{team}p1",), rate=False):
            pass
    await _set(engine, f"{team}r1", "paused")
    async with admitted(ctx, caller, (f"{team}p1",), rate=False):
        pass
    assert ctx.metrics.refusals.labels(reason="running")._value.get() == 3


async def test_concurrent_creates_of_one_team_never_pass_its_limit_together(
    bus: Bus, engine: AsyncEngine
) -> None:
    team, caller = _team()
    ctx = _ctx(bus, engine, team_max_sandboxes=5)
    release = asyncio.Event()
    admitted_ids: list[str] = []

    async def create(i: int) -> int:
        try:
            async with admitted(ctx, caller, (f"{team}c{i}",)):
                admitted_ids.append(f"{team}c{i}")
                await release.wait()  # in flight: not in the table yet
                raise ApiError(500, "failed to start")  # then they all fail: released
        except ApiError as e:
            return e.status
        return 201

    tasks = [asyncio.create_task(create(i)) for i in range(12)]
    await asyncio.sleep(0.5)
    assert len(admitted_ids) == 5
    release.set()
    statuses = await asyncio.gather(*tasks)
    assert sorted(statuses) == [429] * 7 + [500] * 5
    # failed creates hold nothing: the next five go in
    for i in range(5):
        assert await _try(ctx, caller, f"{team}d{i}") is None


async def test_past_the_rate_a_create_is_refused_until_a_token_is_back(
    bus: Bus, engine: AsyncEngine
) -> None:
    team, caller = _team()
    ctx = _ctx(bus, engine, team_creates_per_s=2, team_creates_burst=2)
    assert await _try(ctx, caller, "a") is None
    assert await _try(ctx, caller, "b") is None
    refused = await _try(ctx, caller, "c")
    assert refused is not None and refused.status == 429
    assert f"team {team} may start 2 sandboxes per second, 2 at once" in refused.message
    assert refused.headers["Retry-After"] == "1"
    other = _team()[1]
    assert await _try(ctx, other, "d") is None  # another team's bucket
    await asyncio.sleep(0.6)
    assert await _try(ctx, caller, "e") is None


async def test_a_fork_takes_a_slot_and_a_token_per_child(bus: Bus, engine: AsyncEngine) -> None:
    n = 3
    team, caller = _team()
    ctx = _ctx(bus, engine, team_max_sandboxes=4, team_creates_per_s=1, team_creates_burst=3)
    async with admitted(ctx, caller, [f"fork-x-{i}" for i in range(n)]) as ticket:
        ticket.track([f"{team}child{i}" for i in range(n)])
    e = await _try(ctx, caller, "one-more")  # 3 children held + 1 = 4: the slot is there
    assert e is not None and e.status == 429 and "per second" in e.message  # the bucket is not
