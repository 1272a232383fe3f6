"""Leases and bulk matching over the real read model (issue 32): the bulk filter is E2B's
list filter (every pair contained, exact values, the caller's team only, killed ones
left out); the lease projection and the lease timer's scans; one timer tick expires a
lease past its deadline and sends its sandboxes their end, the same ids when repeated."""

from __future__ import annotations

import secrets
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from bus import Bus, MessageContext
from bus.bulk import Member, end_command
from bus.decisions import execute
from domain import lease as ls
from domain import sandbox as sb
from domain import utcnow
from domain.sandbox.values import new_sandbox_id
from projections import Projector, leasequeries
from tests.integration.projections.lifecycle import kill, step
from workers.timer.leases import LeaseTimer, sweep_tag


async def _running(bus: Bus, team: str, metadata: dict[str, str]) -> tuple[str, int]:
    sid = new_sandbox_id()
    await step(
        bus, sb.CreateSandbox(sandbox_id=sid, template_id="base", team_id=team, metadata=metadata)
    )
    v = await step(bus, sb.CompleteCreate(sandbox_id=sid, node_id="n1"))
    return sid, v.seq


async def test_bulk_matching_is_the_list_filter_of_one_team(
    bus: Bus, engine: AsyncEngine, projectors: dict[str, Projector]
) -> None:
    team, other = f"team-{secrets.token_hex(3)}", f"other-{secrets.token_hex(3)}"
    a, _ = await _running(bus, team, {"job": "j1", "k": "v"})
    b, _ = await _running(bus, team, {"job": "j1"})
    c, _ = await _running(bus, team, {"job": "j2", "k": "v"})
    d, _ = await _running(bus, team, {"job": "j1"})
    await kill(bus, d)
    _, seq = await _running(bus, other, {"job": "j1", "k": "v"})
    await projectors["sandboxes"].wait_for(seq)
    async with engine.connect() as conn:
        ids = lambda ms: sorted(m.sandbox_id for m in ms)  # noqa: E731

        assert ids(await leasequeries.matching_sandboxes(conn, team, {"job": "j1"})) == sorted(
            [a, b]
        )
        assert ids(await leasequeries.matching_sandboxes(conn, team, {"job": "j1", "k": "v"})) == [
            a
        ]
        assert ids(await leasequeries.matching_sandboxes(conn, team, {"k": "v"})) == sorted([a, c])
        assert await leasequeries.matching_sandboxes(conn, team, {"job": "J1"}) == []  # exact
        assert await leasequeries.matching_sandboxes(conn, team, {"job": "j"}) == []  # not a prefix
        assert ids(await leasequeries.matching_sandboxes(conn, team, None)) == sorted([a, b, c])
        (m,) = await leasequeries.matching_sandboxes(conn, team, {"job": "j2"})
        assert m == Member(c, "n1", sb.SandboxStatus.RUNNING, 2)


async def test_a_lease_past_its_deadline_is_expired_and_swept_by_one_tick(
    bus: Bus, engine: AsyncEngine, projectors: dict[str, Projector]
) -> None:
    team = f"team-{secrets.token_hex(3)}"
    lease_id = f"lease-{secrets.token_hex(4)}"
    t0 = utcnow() - timedelta(seconds=30)
    await execute(bus.leases, ls.OpenLease(lease_id=lease_id, team_id=team, ttl_s=10, at=t0))
    live = f"lease-{secrets.token_hex(4)}"
    await execute(bus.leases, ls.OpenLease(lease_id=live, team_id=team, ttl_s=600))
    members = [await _running(bus, team, {ls.LEASE_KEY: lease_id}) for _ in range(3)]
    kept, seq = await _running(bus, team, {ls.LEASE_KEY: live})
    await projectors["sandboxes"].wait_for(seq)
    await projectors["leases"].wait_for((await bus.leases.version(live)).seq)

    async with engine.connect() as conn:
        due = await leasequeries.due_leases(conn, utcnow())
        assert lease_id in {x.lease_id for x in due} and live not in {x.lease_id for x in due}
        counts = await leasequeries.lease_member_counts(conn, team, [lease_id, live])
        assert counts == {lease_id: 3, live: 1}

    sent: list[list[str]] = []

    async def q_due(now):  # type: ignore[no-untyped-def]
        async with engine.connect() as conn:
            return [x for x in await leasequeries.due_leases(conn, now) if x.team_id == team]

    async def q_swept(since):  # type: ignore[no-untyped-def]
        async with engine.connect() as conn:
            return [x for x in await leasequeries.swept_leases(conn, since) if x.team_id == team]

    async def q_members(team_id: str, lid: str) -> list[Member]:
        async with engine.connect() as conn:
            found = await leasequeries.matching_sandboxes(conn, team_id, {ls.LEASE_KEY: lid})
        sent.append(sorted(m.sandbox_id for m in found))
        return found

    expired: list[str] = []
    timer = LeaseTimer(
        bus,
        due=q_due,
        swept=q_swept,
        members=q_members,
        on_expired=lambda x: expired.append(x.lease_id),
    )
    await timer.tick(utcnow())
    state, _ = await bus.leases.load(lease_id)
    assert state is not None and state.status is ls.LeaseStatus.EXPIRED
    assert expired == [lease_id]  # the metric's hook: told once, of the expiry it decided
    assert sent == [sorted(s for s, _ in members)]  # the live lease's sandbox untouched
    await timer.tick(utcnow())  # the next tick sweeps again but expires nothing again
    assert expired == [lease_id]
    # the commands went to the node's queue, one per sandbox, and a repeat is a duplicate
    receipts = []
    for sid, _ in members:
        m = Member(sid, "n1", sb.SandboxStatus.RUNNING, 2)

        cmd = end_command(m, "kill", tag=sweep_tag(state))
        receipts.append(await bus.commands.to_node("n1", cmd, context=MessageContext()))
    assert all(r.duplicate for r in receipts)
    async with engine.connect() as conn:
        await projectors["leases"].wait_for((await bus.leases.version(lease_id)).seq)
        swept = await leasequeries.swept_leases(
            conn, utcnow() - timedelta(seconds=ls.SWEEP_AFTER_END_S)
        )
        assert lease_id in {x.lease_id for x in swept}
    assert kept
