"""Template tags through the unchanged e2b SDKs, on the real API, NATS and Postgres with the
in-memory node host: every build of a name is a capture of its own, `name:tag` starts the
build the tag names after later builds moved `default`, tags are assigned, listed and
removed, and a capture no tag names any more is dropped once its grace has passed. Also:
a build whose steps were sent is `building` at once, as E2B reports it, never `waiting`.

Builds are plain imports of a registry reference (`from_image` with no steps: the memory
host checks the reference and pulls nothing), so each build is a capture in moments."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Template, TemplateException
from e2b.template.main import TemplateBuilder
from e2b.template.types import TemplateBuildStatus

from bus import Bus
from domain import build as bd
from domain import sandbox as sb
from domain import template as tp
from tests.support import eventually_sync
from tests.vmless.conftest import VmlessStack, vmless_stack

NPM = Path(__file__).resolve().parents[2] / ".npm-e2b"
GRACE_S = 1


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    with vmless_stack(tmp_path_factory.mktemp("aenv-tags"), AENV_CAPTURE_GRACE_S=str(GRACE_S)) as s:
        yield s


@pytest.fixture(autouse=True)
def sdk_env(stack: VmlessStack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_URL", stack.api_url)
    monkeypatch.setenv("E2B_API_KEY", stack.api_key)


def _image() -> TemplateBuilder:
    return Template().from_image("busybox:latest")


def _read(stack: VmlessStack, kind: str, aggregate_id: str) -> list[object]:
    async def read() -> list[object]:
        bus = await Bus.connect(stack.bus_settings, setup=False)
        try:
            store = {"sandbox": bus.sandboxes, "template": bus.templates, "build": bus.builds}
            return [r.event for r in await store[kind].read(aggregate_id)]  # type: ignore[attr-defined]
        finally:
            await bus.close()

    return asyncio.run(read())


def _create(c: httpx.Client, ref: str) -> httpx.Response:
    return c.post("/v2/sandboxes", json={"templateID": ref, "timeout": 60})


def _restored(stack: VmlessStack, sandbox_id: str) -> str:
    """The capture a sandbox was created from, as its log recorded it."""
    first = _read(stack, "sandbox", sandbox_id)[0]
    assert isinstance(first, sb.SandboxRequested)
    return first.spec.template_id


def _tags(name: str) -> dict[str, str]:
    return {t.tag: t.build_id for t in Template.get_tags(name)}


def test_a_tag_starts_its_build_after_later_builds(stack: VmlessStack) -> None:
    name = f"tags-{uuid.uuid4().hex[:8]}"
    v1 = Template.build(_image(), f"{name}:v1")
    assert v1.template_id == name and set(v1.tags) == {"v1", "default"}
    assert _tags(name) == {"v1": v1.build_id, "default": v1.build_id}
    v2 = Template.build(_image(), name, tags=["v2", "latest"])
    assert _tags(name) == {
        "v1": v1.build_id,
        "default": v2.build_id,
        "v2": v2.build_id,
        "latest": v2.build_id,
    }

    with httpx.Client(
        base_url=stack.api_url, headers={"X-API-KEY": stack.api_key}, timeout=30
    ) as c:
        started = {}
        for ref in (name, f"{name}:v1", f"{name}:v2", f"{name}:default"):
            r = _create(c, ref)
            assert r.status_code == 201, (ref, r.text)
            body = r.json()
            assert body["templateID"] == name and body["alias"] == name
            started[ref] = body["sandboxID"]
            detail = c.get(f"/sandboxes/{body['sandboxID']}").json()
            assert detail["templateID"] == name
        assert _restored(stack, started[f"{name}:v1"]) == f"{name}:{v1.build_id}"
        for ref in (name, f"{name}:v2", f"{name}:default"):
            assert _restored(stack, started[ref]) == f"{name}:{v2.build_id}"
        assert _create(c, f"{name}:nope").status_code == 404
        listed = c.get("/v2/sandboxes", params={"template": name}).json()
        assert {s["sandboxID"] for s in listed} >= set(started.values())

        # assign from a tag, then remove tags: the old build lives while one names it
        info = Template.assign_tags(f"{name}:v1", ["stable", "Prod"])
        assert info.build_id == v1.build_id and sorted(info.tags) == ["prod", "stable"]
        Template.remove_tags(name, ["v1", "never-assigned"])
        assert _create(c, f"{name}:v1").status_code == 404
        r = _create(c, f"{name}:stable")
        assert r.status_code == 201 and _restored(stack, r.json()["sandboxID"]) == (
            f"{name}:{v1.build_id}"
        )
        with pytest.raises(TemplateException):
            Template.remove_tags(name, "default")  # 400: default stays
        with pytest.raises(TemplateException):
            Template.assign_tags(f"{name}:v1", "again")  # 404: v1 is gone
        with pytest.raises(TemplateException):
            Template.assign_tags("base", "mine")  # 403: not the caller's template
        assert [t.tag for t in Template.get_tags("base")] == ["default"]

        # the last tags on v1's build go: its capture is dropped after the grace
        capture = f"{name}:{v1.build_id}"
        assert _create(c, capture).status_code == 201  # a build's capture id names it too
        Template.remove_tags(name, ["stable", "prod"])
        assert set(_tags(name)) == {"default", "v2", "latest"}

        def dropped() -> bool:
            history = _read(stack, "template", name)
            return any(
                isinstance(e, tp.TemplateCaptureDropped) and e.capture_id == capture
                for e in history
            )

        eventually_sync(dropped, timeout=30, interval=0.3)
        assert any(isinstance(e, tp.TemplateDeleted) for e in _read(stack, "template", capture))
        assert _create(c, capture).status_code == 404
        r = _create(c, name)  # the build default names is untouched
        assert r.status_code == 201 and _restored(stack, r.json()["sandboxID"]) == (
            f"{name}:{v2.build_id}"
        )

        # deleting the template takes every tag, and its captures with it at once
        assert c.delete(f"/templates/{name}").status_code == 204
        assert _create(c, f"{name}:v2").status_code == 404
        assert not Template.exists(name)
        gone = _read(stack, "template", f"{name}:{v2.build_id}")
        assert any(isinstance(e, tp.TemplateDeleted) for e in gone)
        drops = [
            e.capture_id
            for e in _read(stack, "template", name)
            if isinstance(e, tp.TemplateCaptureDropped)
        ]
        assert drops == [capture, f"{name}:{v2.build_id}"]


def test_the_javascript_sdk_reads_and_moves_the_same_tags(stack: VmlessStack) -> None:
    if not (NPM / "node_modules" / "e2b").exists():
        pytest.skip("the JavaScript SDK is not installed (.npm-e2b)")
    name = f"jstags-{uuid.uuid4().hex[:8]}"
    first = Template.build(_image(), f"{name}:v1")
    Template.build(_image(), name)
    script = """
const {Template} = require('e2b');
(async () => {
  const assigned = await Template.assignTags(process.argv[1] + ':v1', 'js');
  await Template.removeTags(process.argv[1], ['v1']);
  const tags = await Template.getTags(process.argv[1]);
  console.log(JSON.stringify({assigned, tags}));
})().catch(e => { console.error(e); process.exit(1); });
"""
    env = {**os.environ, "E2B_API_URL": stack.api_url, "E2B_API_KEY": stack.api_key}
    r = subprocess.run(
        ["node", "-e", script, name], env=env, cwd=NPM, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["assigned"] == {"buildId": first.build_id, "tags": ["js"]}
    assert {t["tag"]: t["buildId"] for t in out["tags"]}["js"] == first.build_id
    assert {t["tag"] for t in out["tags"]} == {"default", "js"}


def test_a_started_build_is_building_not_waiting(stack: VmlessStack) -> None:
    """E2B's `waiting` is a build whose steps were not sent yet; once `build_in_background`
    returns they were, and E2B says `building` whether or not a builder has it yet."""
    name = f"status-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        info = Template.build_in_background(_image(), name)
        status = Template.get_build_status(info).status
        assert status in (TemplateBuildStatus.BUILDING, TemplateBuildStatus.READY), status
        # recorded before the start was answered: queued for a builder, then claimed
        kinds = [type(e) for e in _read(stack, "build", info.build_id)]
        assert kinds[:2] == [bd.TemplateBuildRequested, bd.TemplateBuildStarted], kinds
        started = _read(stack, "build", info.build_id)[1]
        assert isinstance(started, bd.TemplateBuildStarted) and started.queued
        eventually_sync(
            lambda info=info: (
                Template.get_build_status(info).status  # type: ignore[misc]
                is TemplateBuildStatus.READY
            ),
            timeout=30,
            interval=0.2,
        )
        kinds = [type(e) for e in _read(stack, "build", info.build_id)]
        assert bd.TemplateBuildClaimed in kinds and kinds[-1] is bd.TemplateBuilt
