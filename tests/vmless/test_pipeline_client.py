"""The pipeline client (`aenv_pipeline`) against the real control plane, no VMs: creates
published straight to NATS are sandboxes the API shows, a kill and a pause through the
client are answered from the log, a live follow sees them, and one sandbox's replayed
history folds to what the read model says. Another team's pipeline sees none of it."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
import nats
import pytest

import aenv_pipeline
from aenv_pipeline import Event, Outcome
from tests.support import eventually
from tests.vmless.conftest import NATS_URL, VmlessStack


async def _read_model(stack: VmlessStack, sandbox_id: str) -> dict[str, Any] | None:
    async with httpx.AsyncClient(
        base_url=stack.api_url, headers={"X-API-KEY": stack.api_key}, timeout=30
    ) as c:
        r = await c.get(f"/sandboxes/{sandbox_id}")
    assert r.status_code in (200, 404), r.text
    return r.json() if r.status_code == 200 else None


async def other_process_create(
    prefix: str, command_id: uuid.UUID, sandbox_id: str, run: str
) -> Outcome:
    """The same create again from a pipeline that never saw the first (a restarted one)."""
    async with await aenv_pipeline.connect(NATS_URL, team="default", prefix=prefix) as again:
        return await again.create_sandbox(
            "base", sandbox_id=sandbox_id, metadata={"run": run}, command_id=command_id, wait=30
        )


async def test_a_pipeline_drives_and_audits_sandboxes_over_nats(vmless: VmlessStack) -> None:
    prefix = vmless.bus_settings.bus_prefix
    run = "run" + uuid.uuid4().hex[:8]
    p = await aenv_pipeline.connect(NATS_URL, team="default", prefix=prefix)
    other = await aenv_pipeline.connect(NATS_URL, team="someone-else", prefix=prefix)
    try:
        outcomes = await asyncio.gather(
            *(
                p.create_sandbox("base", timeout_s=120, metadata={"run": run, "i": str(i)})
                for i in range(3)
            )
        )
        assert all(isinstance(o, Outcome) and o.event.type == "SandboxCreated" for o in outcomes)
        ids = [o.sandbox_id for o in outcomes if isinstance(o, Outcome)]
        for sid in ids:  # the API shows them, with what the pipeline asked for
            body = await _read_model(vmless, sid)
            assert body is not None and body["state"] == "running"
            assert body["metadata"]["run"] == run
        start = max(o.event.seq for o in outcomes if isinstance(o, Outcome))

        seen: list[Event] = []

        async def follow() -> None:
            # from just after the creates: no race with the commands below
            async for e in p.follow(since=start + 1, metadata={"run": run}):
                seen.append(e)
                if e.type == "SandboxPaused":
                    return

        follower = asyncio.create_task(follow())
        killed = await p.kill(ids[0])
        assert killed is not None and killed.event.type == "SandboxKilled"
        assert await p.kill(ids[0]) is None  # already killed: nothing sent
        paused = await p.pause(ids[1])
        assert paused is not None and paused.event.type == "SandboxPaused"
        await asyncio.wait_for(follower, 30)
        assert [(e.sandbox_id, e.type) for e in seen] == [
            (ids[0], "SandboxKillRequested"),
            (ids[0], "SandboxKilled"),
            (ids[1], "SandboxPauseRequested"),
            (ids[1], "SandboxPaused"),
        ]

        # the log, replayed: the run's whole history, and from a point on
        everything = [e async for e in p.replay(metadata={"run": run})]
        assert {e.sandbox_id for e in everything} == set(ids)
        assert [e.type for e in everything].count("SandboxRequested") == 3
        later = [(e.sandbox_id, e.type) async for e in p.replay(since=start + 1)]
        assert later == [(e.sandbox_id, e.type) for e in seen]
        t0 = min(e.time for e in everything)  # from a time: the same run, whole
        by_time = [e.seq async for e in p.replay(since=t0, metadata={"run": run})]
        assert by_time == [e.seq for e in everything]
        one = [e.type async for e in p.replay(sandbox=ids[1])]
        assert one == [
            "SandboxRequested",
            "SandboxCreated",
            "SandboxPauseRequested",
            "SandboxPaused",
        ]

        # each sandbox's history folds to what the read model says (killed: a 404)
        for sid in ids:
            assert await p.verify(sid, await _read_model(vmless, sid) or {}) == []
        body = await _read_model(vmless, ids[2])
        assert body is not None
        drift = await p.verify(ids[2], {**body, "state": "paused"})
        assert [m.field for m in drift] == ["state"]

        # a retried create (same command id, a new process): stored once, answered from the log
        retry_id = uuid.uuid4()
        first = await p.create_sandbox("base", metadata={"run": run + "x"}, command_id=retry_id)
        again = await other_process_create(prefix, retry_id, first.sandbox_id, run + "x")
        assert (again.sandbox_id, again.event.seq) == (first.sandbox_id, first.event.seq)
        await p.kill(first.sandbox_id)

        assert await p.history("nosuch") == []
        with pytest.raises(LookupError):
            await p.kill("nosuch")

        # another team's pipeline: nothing to read, nothing to command
        assert await other.history(ids[2]) == []
        assert [e async for e in other.replay(metadata={"run": run})] == []
        with pytest.raises(LookupError):
            await other.kill(ids[2])
        await p.kill(ids[1])

        # a live follow (from now): it hears the kill sent after its consumer exists, and its
        # consumer goes when it is closed. By name, not by count: the stack's own roles make
        # and drop consumers on the same stream meanwhile (a count once never came back).
        async def consumers() -> set[str]:
            infos = await p.js.consumers_info(p.names.event_stream)
            return {c.name for c in infos}

        before = await consumers()
        following = p.follow(sandbox=ids[2])
        live = asyncio.create_task(anext(following))

        async def new_ones() -> set[str]:
            return await consumers() - before

        mine = await eventually(new_ones)
        await p.kill(ids[2])
        assert (await asyncio.wait_for(live, 30)).type == "SandboxKillRequested"
        await following.aclose()

        async def one_gone() -> bool:
            return len(mine & await consumers()) < len(mine)

        await eventually(one_gone, timeout=30, interval=0.2)
    finally:
        await other.close()
        await p.close()


def test_a_pipeline_login_for_a_nats_of_ones_own(vmless: VmlessStack) -> None:
    """Without an embedded NATS the command makes the team's stream and prints the
    permissions for the operator's config: its team's ingress and stream, nothing else."""
    r = vmless.aenv(
        "keys", "pipeline", "create", "--team", "ext", "--data-dir", str(vmless.data_dir)
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    prefix = vmless.bus_settings.bus_prefix
    assert "reloaded" not in out and out["user"].startswith("pipeline-ext-") and out["password"]
    assert out["stream"] == f"{prefix.upper()}_AENV_TEAM_ext"
    publish = out["permissions"]["publish"]["allow"]
    assert f"{prefix}.aenv.in.ext.>" in publish
    assert all(out["stream"] in s for s in publish if s.startswith("$JS."))

    async def stream_made() -> None:
        nc = await nats.connect(NATS_URL)
        try:
            info = await nc.jetstream().stream_info(out["stream"])
            assert info.config.sources and info.config.sources[0].filter_subject == (
                f"{prefix}.aenv.feed.ext.>"
            )
        finally:
            await nc.close()

    asyncio.run(stream_made())
