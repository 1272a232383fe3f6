"""Projections against real Postgres and NATS: a lifecycle, read-your-writes, monotonicity."""

from __future__ import annotations

import uuid

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from bus import Bus, MessageContext
from domain import CommandRejected
from domain import sandbox as sb
from domain.sandbox.values import new_sandbox_id
from projections import Projector, SandboxProjection, checkpoints, format_history, history
from projections.tables import sandboxes, snapshots, template_spawns
from tests.integration.projections.lifecycle import T0, at, full_lifecycle, kill, step


async def row(engine: AsyncEngine, sid: str) -> dict[str, object]:
    async with engine.connect() as conn:
        r = (await conn.execute(select(sandboxes).where(sandboxes.c.sandbox_id == sid))).one()
    return dict(r._mapping)


async def test_full_lifecycle_is_projected(
    bus: Bus, engine: AsyncEngine, projectors: dict[str, Projector]
) -> None:
    sid = new_sandbox_id()
    p = projectors["sandboxes"]
    v = await step(
        bus, sb.CreateSandbox(sandbox_id=sid, template_id="base", team_id="t9", at=T0, timeout_s=60)
    )
    await p.wait_for(v.seq)
    r = await row(engine, sid)
    assert (r["status"], r["state"], r["revision"]) == ("creating", None, 1)

    v = await full_lifecycle(bus, new_sandbox_id())  # another one, in parallel history
    sid2 = new_sandbox_id()
    v = await full_lifecycle(bus, sid2)
    await p.wait_for(v.seq)
    r = await row(engine, sid2)
    assert r["status"] == "running" and r["state"] == "running"
    assert r["node_id"] == "node2" and r["team_id"] == "team1" and r["alias"] == "base"
    assert r["metadata"] == {"suite": "acc"} and r["on_timeout"] == "pause"
    assert r["started_at"] == at(1) and r["end_at"] == at(730)  # timeout set at 130 s
    assert r["envd_access_token"] == "tok" and r["revision"] == v.revision
    assert r["last_seq"] == v.seq and r["updated_at"] == at(130)
    async with engine.connect() as conn:
        snap = (
            (await conn.execute(select(snapshots).where(snapshots.c.snapshot_id == f"{sid2}:v1")))
            .one()
            ._mapping
        )
        node = (await conn.execute(text("SELECT * FROM nodes WHERE node_id = 'node2'"))).one()
    assert snap["status"] == "ready" and snap["size_bytes"] == 4096
    assert snap["team_id"] == "team1" and snap["taken_at"] == at(112)
    assert node.running >= 1

    v = await kill(bus, sid2)
    await p.wait_for(v.seq)
    r = await row(engine, sid2)
    assert r["status"] == "killed" and r["state"] is None


async def test_paused_row_keeps_remaining_ttl(
    bus: Bus, engine: AsyncEngine, projectors: dict[str, Projector]
) -> None:
    sid = new_sandbox_id()
    await step(bus, sb.CreateSandbox(sandbox_id=sid, template_id="base", at=T0, timeout_s=60))
    await step(bus, sb.CompleteCreate(sandbox_id=sid, node_id="n", at=at(0)))
    await step(bus, sb.PauseSandbox(sandbox_id=sid, at=at(20)))
    v = await step(bus, sb.CompletePause(sandbox_id=sid, at=at(20)))
    await checkpoints.wait_for(engine, "sandboxes", v.seq)  # the cross-process way
    r = await row(engine, sid)
    assert r["state"] == "paused" and r["remaining_s"] == 40


async def test_rejections_on_unknown_sandbox_make_no_row(
    bus: Bus, engine: AsyncEngine, projectors: dict[str, Projector]
) -> None:
    sid = new_sandbox_id()
    rej = CommandRejected(
        aggregate_id=sid,
        command_id=sb.PauseSandbox(sandbox_id=sid).command_id,
        command_type="PauseSandbox",
        code="not_found",
        reason="x",
        at=T0,
    )
    v = await bus.sandboxes.append_rejection(sid, rej, context=MessageContext())
    await projectors["sandboxes"].wait_for(v.seq)
    async with engine.connect() as conn:
        n = await conn.scalar(select(sandboxes.c.revision).where(sandboxes.c.sandbox_id == sid))
    assert n is None


async def test_upserts_never_go_backwards(
    bus: Bus, engine: AsyncEngine, projectors: dict[str, Projector]
) -> None:
    sid = new_sandbox_id()
    await step(bus, sb.CreateSandbox(sandbox_id=sid, template_id="base", at=T0))
    v = await step(bus, sb.CompleteCreate(sandbox_id=sid, node_id="n", at=at(1)))
    await projectors["sandboxes"].wait_for(v.seq)
    before = await row(engine, sid)
    old = (await bus.sandboxes.read(sid))[:1]  # replay the first event alone
    async with engine.begin() as conn:
        await SandboxProjection().apply(conn, old)
    assert await row(engine, sid) == before


async def test_history_from_the_stream(bus: Bus) -> None:
    sid = new_sandbox_id()
    await full_lifecycle(bus, sid)
    await kill(bus, sid)
    lines = await history(bus.sandboxes, sid)
    assert [ln.type for ln in lines][:3] == [
        "SandboxRequested",
        "SandboxCreated",
        "SandboxPauseRequested",
    ]
    assert lines[-1].type == "SandboxKilled" and lines[1].actor == "node:node1"
    assert all(ln.causation_id is not None for ln in lines)
    text_ = format_history(lines)
    assert "SandboxForked" in text_ and "tok" not in text_ and '"<redacted>"' in text_


def test_row_round_trip_is_lossless() -> None:
    """Pure: a row rebuilds the very state it was written from (minus recent command ids)."""
    from datetime import timedelta

    from bus import EventEnvelope, RecordedEvent
    from projections import sandbox_from_row, sandbox_row

    state: sb.State = None
    cmds: list[sb.SandboxCommand] = [
        sb.CreateSandbox(
            sandbox_id="s",
            template_id="t",
            at=T0,
            metadata={"a": "b"},
            network=sb.NetworkPolicy(allow_out=("1.2.3.0/24",)),
        ),
        sb.CompleteCreate(sandbox_id="s", node_id="n", at=T0),
        sb.ForkSandbox(sandbox_id="s", count=2, at=T0 + timedelta(seconds=1)),
    ]
    for c in cmds:
        state = sb.fold(sb.decide(state, c), state)
        assert state is not None
        env = EventEnvelope(
            event_id=c.command_id,
            type="x",
            schema_version=1,
            aggregate_id="s",
            aggregate_version=1,
            occurred_at=T0,
            payload={},
        )
        rec = RecordedEvent(
            seq=1, subject="x", envelope=env, event=sb.SandboxKilled(sandbox_id="s", at=T0)
        )
        back = sandbox_from_row(sandbox_row(state, rec))
        assert back == state.model_copy(update={"recent_commands": ()})


async def _spawns(engine: AsyncEngine, template_id: str) -> tuple[int, object] | None:
    async with engine.connect() as conn:
        r = (
            await conn.execute(
                select(template_spawns).where(template_spawns.c.template_id == template_id)
            )
        ).one_or_none()
    return (r.spawn_count, r.last_spawned_at) if r is not None else None


async def test_creates_are_counted_per_template_once(
    bus: Bus, engine: AsyncEngine, projectors: dict[str, Projector]
) -> None:
    """E2B's `spawnCount`: each create of a sandbox from the template, a build's capture
    counting for its template; a resume, a create not answered yet, or a replayed event
    does not count."""
    tid = f"spawned-{uuid.uuid4().hex[:8]}"
    p = projectors["sandboxes"]
    sids = [new_sandbox_id() for _ in range(4)]
    refs = [tid, f"{tid}:{uuid.uuid4()}", tid, tid]  # the second: a build's capture
    for i, (sid, ref) in enumerate(zip(sids, refs, strict=True)):
        await step(bus, sb.CreateSandbox(sandbox_id=sid, template_id=ref, at=at(i), timeout_s=60))
    for i, sid in enumerate(sids[:3]):  # the last one is still being created
        v = await step(bus, sb.CompleteCreate(sandbox_id=sid, node_id="n", at=at(10 + i)))
    await p.wait_for(v.seq)
    assert await _spawns(engine, tid) == (3, at(12))

    await step(bus, sb.PauseSandbox(sandbox_id=sids[0], at=at(20)))
    await step(bus, sb.CompletePause(sandbox_id=sids[0], at=at(21)))
    await step(bus, sb.ResumeSandbox(sandbox_id=sids[0], at=at(30)))
    v = await step(bus, sb.CompleteResume(sandbox_id=sids[0], node_id="n", at=at(31)))
    await p.wait_for(v.seq)
    assert await _spawns(engine, tid) == (3, at(12))

    async with engine.begin() as conn:  # every event of the template's sandboxes again
        for sid in sids:
            await SandboxProjection().apply(conn, await bus.sandboxes.read(sid))
    assert await _spawns(engine, tid) == (3, at(12))
    v = await step(bus, sb.CompleteCreate(sandbox_id=sids[3], node_id="n", at=at(40)))
    await p.wait_for(v.seq)
    assert await _spawns(engine, tid) == (4, at(40))
