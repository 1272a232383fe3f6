"""The pipelines' feed (`bus.teamfeed`) on a real JetStream: two copiers sharing the
durable (two API processes) still put each sandbox's events into the feed in revision
order, under the team of its `SandboxRequested`, with the secrets stripped; a team's
stream (sourced by NATS) gets its team's events and nobody else's."""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import uuid
from typing import Any

import nats

from bus import BusSettings, delete_all
from bus.headers import EVENT_SEQ
from bus.setup import ensure_streams
from bus.subjects import Names
from bus.teamfeed import TeamFeed, ensure_team_stream
from tests.support import eventually

NATS_URL = "nats://127.0.0.1:4222"
SANDBOXES, EVENTS = 12, 6


class _Jittery(TeamFeed):
    """A copier that takes a random while per event: the other one overtakes it."""

    async def _copy(self, msg: Any) -> None:
        await asyncio.sleep(random.random() * 0.01)
        await super()._copy(msg)


def _event(sid: str, revision: int, team: str) -> bytes:
    env: dict[str, Any] = {
        "event_id": str(uuid.uuid4()),
        "type": "SandboxRequested" if revision == 1 else f"Step{revision}",
        "schema_version": 2,
        "aggregate_id": sid,
        "aggregate_version": revision,
        "occurred_at": "2026-01-01T00:00:00Z",
        "payload": {"n": revision},
    }
    if revision == 1:
        env["payload"] = {
            "spec": {"team_id": team, "envd_access_token": "tok-" + sid, "env_vars": {"K": "v"}}
        }
    return json.dumps(env).encode()


async def test_two_copiers_keep_each_sandboxs_order_and_strip_secrets() -> None:
    settings = BusSettings(nats_url=NATS_URL, bus_prefix=f"t{secrets.token_hex(4)}")
    names = Names(settings.bus_prefix)
    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    feeds = [_Jittery(js, names, batch=2), _Jittery(js, names, batch=2)]
    try:
        await ensure_streams(js, settings)
        team_a = await ensure_team_stream(js, names, "a")
        for f in feeds:
            await f.start()
        teams = {f"s{i}": ("a" if i % 2 else "b") for i in range(SANDBOXES)}
        for sid, team in teams.items():  # one sandbox's in a row: both copiers get some
            for revision in range(1, EVENTS + 1):
                await js.publish(names.sandbox_events(sid), _event(sid, revision, team))

        async def copied() -> bool:
            info = await js.stream_info(names.feed_stream)
            return info.state.messages == SANDBOXES * EVENTS

        await eventually(copied, timeout=30)
        for sid, team in teams.items():
            sub = await js.subscribe(
                names.feed(team, sid), stream=names.feed_stream, ordered_consumer=True
            )
            got = [await sub.next_msg(timeout=5) for _ in range(EVENTS)]
            await sub.unsubscribe()
            envs = [json.loads(m.data) for m in got]
            assert [e["aggregate_version"] for e in envs] == list(range(1, EVENTS + 1)), sid
            spec = envs[0]["payload"]["spec"]
            assert spec["envd_access_token"] is None and spec["env_vars"] == {"K": "<redacted>"}
            assert all(m.headers and m.headers.get(EVENT_SEQ) for m in got)

        async def sourced() -> bool:
            info = await js.stream_info(team_a)
            return info.state.messages == SANDBOXES // 2 * EVENTS

        await eventually(sourced, timeout=15)
        info = await js.stream_info(team_a, subjects_filter=names.all_feed)
        assert set(info.state.subjects or {}) == {
            names.feed("a", sid) for sid, t in teams.items() if t == "a"
        }
    finally:
        for f in feeds:
            await f.stop()
        await delete_all(js, settings)
        await nc.close()
