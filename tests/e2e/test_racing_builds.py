"""Eight racing `Template.build` of one alias through the unchanged e2b SDK (issue 43): all
eight end `ready`, and the log shows one build sandbox — one build claimed and ran, seven
joined it (`domain/buildkey.py`, `workers/build/sharing.py`) — with the template's
`default` on that build's capture, which `Sandbox.create(alias)` starts."""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2b import Sandbox, Template

from bus import Bus, BusSettings
from domain import build as bd
from domain import sandbox as sb
from domain import tags as tg
from tests.e2e.conftest import Stack
from workers.build.run import build_sandbox_id

pytestmark = pytest.mark.vm

RACERS = 8


def _history(stack: Stack, build_ids: list[str], alias: str) -> tuple[dict, dict, object]:
    async def read() -> tuple[dict, dict, object]:
        bus = await Bus.connect(BusSettings(nats_url=stack.nats_url), setup=False)
        try:
            builds = {b: [r.event for r in await bus.builds.read(b)] for b in build_ids}
            sandboxes = {b: await bus.sandboxes.read(build_sandbox_id(b)) for b in build_ids}
            template, _ = await bus.templates.load(alias)
            return builds, sandboxes, template
        finally:
            await bus.close()

    return asyncio.run(read())


def test_eight_racing_builds_of_one_alias_run_one_build_sandbox(stack: Stack) -> None:
    alias = f"race-{uuid.uuid4().hex[:8]}"
    template = Template().from_template("base").run_cmd("echo raced > /opt/raced")

    def build(_: int) -> str:
        return Template.build(template, alias).build_id

    with ThreadPoolExecutor(RACERS) as pool:
        build_ids = list(pool.map(build, range(RACERS)))  # each returns once `ready`
    assert len(set(build_ids)) == RACERS

    builds, sandboxes, tpl = _history(stack, build_ids, alias)
    for b, events in builds.items():
        assert isinstance(events[-1], bd.TemplateBuilt), (b, events[-1])
    ran = [
        b
        for b, events in builds.items()
        if any(isinstance(e, bd.TemplateBuildClaimed) for e in events)
    ]
    joined = {
        b: next(e.leader_build_id for e in events if isinstance(e, bd.TemplateBuildJoined))
        for b, events in builds.items()
        if any(isinstance(e, bd.TemplateBuildJoined) for e in events)
    }
    assert len(ran) == 1, ran
    [leader] = ran
    assert set(joined) == set(build_ids) - {leader}
    assert set(joined.values()) == {leader}
    created = [
        b
        for b, recs in sandboxes.items()
        if any(isinstance(r.event, sb.SandboxCreated) for r in recs)
    ]
    assert created == [leader]  # one build sandbox
    assert tpl is not None
    assert tpl.capture_for(tg.DEFAULT_TAG) == tg.build_capture_id(alias, leader)

    sbx = Sandbox.create(alias)
    try:
        assert sbx.commands.run("cat /opt/raced").stdout == "raced\n"
    finally:
        sbx.kill()
