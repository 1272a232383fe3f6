"""The template listing (`GET /templates`) through the real API, NATS, Postgres and builder
with the in-memory node host: `spawnCount` and `lastSpawnedAt` count the creates of
sandboxes from each template."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from e2b import BuildException, Template

from tests.support import eventually_sync
from tests.vmless.conftest import VmlessStack


@pytest.fixture
def api(vmless: VmlessStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[httpx.Client]:
    monkeypatch.setenv("E2B_API_URL", vmless.api_url)
    monkeypatch.setenv("E2B_API_KEY", vmless.api_key)
    with httpx.Client(
        base_url=vmless.api_url, headers={"X-API-KEY": vmless.api_key}, timeout=30
    ) as c:
        yield c


def _listed(api: httpx.Client, template_id: str) -> dict[str, Any] | None:
    r = api.get("/templates")
    assert r.status_code == 200, r.text
    return next((t for t in r.json() if t["templateID"] == template_id), None)


def test_spawn_count_counts_the_creates_of_a_template(api: httpx.Client) -> None:
    name = f"spawned-{uuid.uuid4().hex[:8]}"
    built = Template.build(Template().from_image("busybox:latest"), name)
    listed = _listed(api, name)
    assert listed is not None
    assert (listed["spawnCount"], listed["lastSpawnedAt"]) == (0, None)
    before = datetime.now().astimezone()
    sandboxes = []
    for ref in (name, name, f"{name}:{built.build_id}"):  # the last: by its build's capture
        r = api.post("/v2/sandboxes", json={"templateID": ref, "timeout": 60})
        assert r.status_code == 201, r.text
        sandboxes.append(r.json()["sandboxID"])
    listed = eventually_sync(
        lambda: (t := _listed(api, name)) is not None and t["spawnCount"] == 3 and t,
        timeout=10,
    )
    assert datetime.fromisoformat(listed["lastSpawnedAt"]) >= before
    one = api.get(f"/templates/{name}").json()
    assert one["spawnCount"] == 3 and one["lastSpawnedAt"] == listed["lastSpawnedAt"]
    for sid in sandboxes:
        assert api.delete(f"/sandboxes/{sid}").status_code == 204


def test_a_template_whose_only_build_failed_is_deleted(api: httpx.Client) -> None:
    """The listing shows a template whose builds all failed (with the reason); its DELETE
    answered 404 (no template had been registered). Now 204, and it is gone."""
    name = f"failed-{uuid.uuid4().hex[:8]}"
    with pytest.raises(BuildException):  # the in-memory node refuses a path with no image
        Template.build(Template().from_image("/no/such/oci-layout"), name)
    listed = _listed(api, name)
    assert listed is not None and listed["buildStatus"] == "error", listed
    assert api.get(f"/templates/{name}").status_code == 200

    r = api.delete(f"/templates/{name}")
    assert r.status_code == 204, r.text
    assert _listed(api, name) is None
    assert api.get(f"/templates/{name}").status_code == 404
    r = api.delete(f"/templates/{name}")  # gone: as for any template
    assert r.status_code == 404 and r.json()["code"] == 404, r.text

    # the name is free again: a build of it that succeeds is listed, alone
    Template.build(Template().from_image("busybox:latest"), name)
    listed = _listed(api, name)
    assert listed is not None and listed["buildStatus"] == "ready"
    assert listed["buildCount"] == 1
    assert api.delete(f"/templates/{name}").status_code == 204
    assert _listed(api, name) is None
