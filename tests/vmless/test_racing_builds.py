"""Eight racing `Template.build` of one alias through the unchanged e2b SDK, on the real API,
NATS, Postgres and builder with the in-memory node host (issue 43): all eight end `ready`,
one build ran (claimed, its capture imported once), seven joined it, and the template's
`default` is that one capture. The e2e tier (`tests/e2e/test_racing_builds.py`) holds the
same over a real build sandbox."""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2b import Template

from bus import Bus
from domain import Event
from domain import build as bd
from domain import tags as tg
from domain import template as tp
from tests.vmless.conftest import VmlessStack

RACERS = 8


Read = tuple[dict[str, list[Event]], list[Event], tp.Template | None]


def _read(stack: VmlessStack, build_ids: list[str], name: str) -> Read:
    async def read() -> Read:
        bus = await Bus.connect(stack.bus_settings, setup=False)
        try:
            builds = {b: [r.event for r in await bus.builds.read(b)] for b in build_ids}
            leader = next(b for b, ev in builds.items() if _ran(ev))
            capture = [r.event for r in await bus.templates.read(tg.build_capture_id(name, leader))]
            template, _ = await bus.templates.load(name)
            return builds, capture, template
        finally:
            await bus.close()

    return asyncio.run(read())


def _ran(events: list[Event]) -> bool:
    return any(isinstance(e, bd.TemplateBuildClaimed) for e in events)


@pytest.mark.usefixtures("sdk_env")
def test_eight_racing_builds_of_one_alias_are_one_build(vmless: VmlessStack) -> None:
    stack = vmless
    name = f"race-{uuid.uuid4().hex[:8]}"

    def build(_: int) -> str:
        return Template.build(Template().from_image("busybox:latest"), name).build_id

    with ThreadPoolExecutor(RACERS) as pool:
        build_ids = list(pool.map(build, range(RACERS)))
    assert len(set(build_ids)) == RACERS

    builds, capture, template = _read(stack, build_ids, name)
    assert all(isinstance(ev[-1], bd.TemplateBuilt) for ev in builds.values()), builds
    ran = [b for b, ev in builds.items() if _ran(ev)]
    assert len(ran) == 1, ran
    [leader] = ran
    joined = {
        b: e.leader_build_id
        for b, ev in builds.items()
        for e in ev
        if isinstance(e, bd.TemplateBuildJoined)
    }
    assert joined == dict.fromkeys(set(build_ids) - {leader}, leader)
    assert sum(isinstance(e, tp.TemplateImported) for e in capture) == 1
    assert template is not None
    assert template.capture_for(tg.DEFAULT_TAG) == tg.build_capture_id(name, leader)

    # asked for once the race is over: a build of its own (a capture of its own)
    again = Template.build(Template().from_image("busybox:latest"), name).build_id
    assert again not in build_ids
    builds, _, template = _read(stack, [again], name)
    assert _ran(builds[again]) and template is not None
    assert template.capture_for(tg.DEFAULT_TAG) == tg.build_capture_id(name, again)
