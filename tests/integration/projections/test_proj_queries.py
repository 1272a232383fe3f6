"""The API's read queries over projected tables: team isolation, E2B listing semantics."""

from __future__ import annotations

import secrets

from sqlalchemy.ext.asyncio import AsyncEngine

from bus import Bus, MessageContext
from domain import apikey as ak
from domain import sandbox as sb
from domain import template as tp
from domain.sandbox.values import new_sandbox_id
from projections import Projector, queries
from tests.integration.projections.lifecycle import at, full_lifecycle, kill, step


async def test_sandbox_listing(
    bus: Bus, engine: AsyncEngine, projectors: dict[str, Projector]
) -> None:
    team = f"team-{secrets.token_hex(3)}"
    ids = []
    for i in range(5):
        sid = new_sandbox_id()
        ids.append(sid)
        await step(
            bus,
            sb.CreateSandbox(
                sandbox_id=sid,
                template_id="base",
                team_id=team,
                at=at(i),
                metadata={"n": str(i), "k": "v"},
            ),
        )
        v = await step(bus, sb.CompleteCreate(sandbox_id=sid, node_id="n", at=at(i)))
    v = await step(bus, sb.PauseSandbox(sandbox_id=ids[0], at=at(10)))
    v = await step(bus, sb.CompletePause(sandbox_id=ids[0], at=at(10)))
    await kill(bus, ids[1])
    other = new_sandbox_id()
    await step(bus, sb.CreateSandbox(sandbox_id=other, template_id="base", team_id="else"))
    v = await step(bus, sb.CompleteCreate(sandbox_id=other, node_id="n"))
    await projectors["sandboxes"].wait_for(v.seq)

    async with engine.connect() as conn:
        page = await queries.list_sandboxes(conn, team, limit=2)
        seen = [r["sandbox_id"] for r in page.rows]
        while page.next_token:
            page = await queries.list_sandboxes(conn, team, limit=2, next_token=page.next_token)
            seen += [r["sandbox_id"] for r in page.rows]
        # newest first; the killed one is gone; the other team's is invisible
        assert seen == [ids[4], ids[3], ids[2], ids[0]]
        running = await queries.list_sandboxes(conn, team, states=["running"])
        assert {r["sandbox_id"] for r in running.rows} == {ids[2], ids[3], ids[4]}
        by_meta = await queries.list_sandboxes(conn, team, metadata={"n": "3"})
        assert [r["sandbox_id"] for r in by_meta.rows] == [ids[3]]
        asc = await queries.list_sandboxes(conn, team, descending=False)
        assert [r["sandbox_id"] for r in asc.rows] == [ids[0], ids[2], ids[3], ids[4]]
        assert await queries.get_sandbox(conn, ids[2], team) is not None
        assert await queries.get_sandbox(conn, ids[2], "else") is None
        assert await queries.get_sandbox(conn, ids[1], team) is None  # killed
        paused = await queries.get_sandbox(conn, ids[0], None)
        assert paused is not None and paused["state"] == "paused"


async def test_templates_keys_snapshots(
    bus: Bus, engine: AsyncEngine, projectors: dict[str, Projector]
) -> None:
    tid = f"tpl{secrets.token_hex(3)}"
    t = await bus.templates.append(
        tid,
        bus.templates.NEW,
        tp.decide_template(None, tp.RegisterTemplate(template_id=tid, alias=f"{tid}-alias")),
        context=MessageContext(),
    )
    raw = ak.new_api_key()
    kid = f"k{secrets.token_hex(3)}"
    k = await bus.api_keys.append(
        kid,
        bus.api_keys.NEW,
        ak.decide_api_key(
            None,
            ak.CreateApiKey(
                key_id=kid,
                team_id="team1",
                prefix=ak.display_prefix(raw),
                key_sha256=ak.hash_api_key(raw),
            ),
        ),
    )
    sid = new_sandbox_id()
    v = await full_lifecycle(bus, sid)
    await projectors["templates"].wait_for(t.seq)
    await projectors["api_keys"].wait_for(k.seq)
    await projectors["sandboxes"].wait_for(v.seq)
    async with engine.connect() as conn:
        by_alias = await queries.template_by_id_or_alias(conn, f"{tid}-alias")
        assert by_alias is not None and by_alias["template_id"] == tid
        key = await queries.api_key_by_hash(conn, ak.hash_api_key(raw))
        assert key is not None and key["team_id"] == "team1"
        assert key["prefix"] == raw[: len(key["prefix"])] and raw not in str(key)
        snaps = await queries.list_snapshots(conn, "team1", sid)
        assert [s["snapshot_id"] for s in snaps] == [f"{sid}:v1"]

    state, version = await bus.api_keys.load(kid)
    k = await bus.api_keys.append(
        kid, version, ak.decide_api_key(state, ak.RevokeApiKey(key_id=kid))
    )
    await projectors["api_keys"].wait_for(k.seq)
    async with engine.connect() as conn:
        assert await queries.api_key_by_hash(conn, ak.hash_api_key(raw)) is None


async def test_a_snapshot_stays_on_the_node_that_took_it(
    bus: Bus, engine: AsyncEngine, projectors: dict[str, Projector]
) -> None:
    """Creates from a snapshot go where its capture is: the node that took it, not the node
    its source sandbox moved to later (a resume elsewhere after its own node was gone)."""
    sid = new_sandbox_id()
    await step(bus, sb.CreateSandbox(sandbox_id=sid, template_id="base", team_id="t", at=at(0)))
    await step(bus, sb.CompleteCreate(sandbox_id=sid, node_id="taker", at=at(1)))
    await step(bus, sb.SnapshotSandbox(sandbox_id=sid, snapshot_id=f"{sid}-s", at=at(2)))
    await step(
        bus, sb.CompleteSnapshot(sandbox_id=sid, snapshot_id=f"{sid}-s", at=at(3), node_id="taker")
    )
    # an event from before the node was recorded: answered by the sandbox's node
    await step(bus, sb.SnapshotSandbox(sandbox_id=sid, snapshot_id=f"{sid}-old", at=at(4)))
    await step(bus, sb.CompleteSnapshot(sandbox_id=sid, snapshot_id=f"{sid}-old", at=at(5)))
    await step(bus, sb.PauseSandbox(sandbox_id=sid, at=at(6)))
    await step(bus, sb.CompletePause(sandbox_id=sid, at=at(7), snapshot_id="p"))
    await step(bus, sb.ResumeSandbox(sandbox_id=sid, at=at(8)))
    v = await step(bus, sb.CompleteResume(sandbox_id=sid, node_id="elsewhere", at=at(9)))
    await projectors["sandboxes"].wait_for(v.seq)
    async with engine.connect() as conn:
        assert await queries.snapshot_node(conn, f"{sid}-s") == "taker"
        assert await queries.snapshot_node(conn, f"{sid}-old") == "elsewhere"


async def test_sandbox_census_counts_live_states_by_node(
    bus: Bus, engine: AsyncEngine, projectors: dict[str, Projector]
) -> None:
    """`aenv_sandboxes{state, node}` (issue 20): the not-killed, not-failed sandboxes."""
    node = f"census-{secrets.token_hex(3)}"
    ids = [new_sandbox_id() for _ in range(4)]
    for sid in ids:
        await step(bus, sb.CreateSandbox(sandbox_id=sid, template_id="base", team_id="t"))
        v = await step(bus, sb.CompleteCreate(sandbox_id=sid, node_id=node))
    await step(bus, sb.PauseSandbox(sandbox_id=ids[0]))
    await step(bus, sb.CompletePause(sandbox_id=ids[0]))
    await kill(bus, ids[1])
    v = await step(
        bus, sb.CreateSandbox(sandbox_id=new_sandbox_id(), template_id="base", team_id="t")
    )
    await projectors["sandboxes"].wait_for(v.seq)
    async with engine.connect() as conn:
        rows = await queries.sandbox_census(conn)
    ours = {(state, n): count for state, n, count in rows if n == node}
    assert ours == {("running", node): 2, ("paused", node): 1}
    assert all(state not in ("killed", "failed") for state, _, _ in rows)
    assert any(n == "" and state == "creating" for state, n, _ in rows)  # not taken yet
    lag = await projectors["sandboxes"].lag()
    assert lag is not None and lag >= 0
