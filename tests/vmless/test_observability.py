"""Seeing the fleet (issue 20) on a stack of its own — nothing else runs commands there, so
counts are exact: both roles' `/metrics` after a build, create, pause, resume, fork,
snapshot and kill, each series with the right count; the node's `/metrics` refused without
the token."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import httpx
import pytest
from e2b import Template
from prometheus_client.parser import text_string_to_metric_families

from bus import Bus
from bus.nodes import NodeBook
from tests.support import eventually_sync
from tests.vmless.conftest import METRICS_TOKEN, VmlessStack, vmless_stack

NODE = "vmless"
#: (name, labels) → value of every sample of a scrape
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    with vmless_stack(tmp_path_factory.mktemp("aenv-obs")) as s:
        yield s


def _node_url(stack: VmlessStack) -> str:
    async def read() -> str:
        bus = await Bus.connect(stack.bus_settings, setup=False)
        try:
            book = await NodeBook.open(bus.js, bus.names.nodes_bucket)
            beat = await book.heartbeat(NODE)
            assert beat is not None and beat.proxy
            return f"http://{beat.proxy}"
        finally:
            await bus.close()

    return asyncio.run(read())


def _scrape(url: str) -> Samples:
    r = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"},
                  timeout=10)  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)  # raises on a malformed line
        for s in family.samples
    }


def _get(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, (name, labels, sorted(k for k in samples if k[0] == name)[:20])
    return samples[key]


def _delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_the_node_metrics_need_the_token(stack: VmlessStack) -> None:
    url = f"{_node_url(stack)}/metrics"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-API-KEY": stack.api_key},
                    {"Authorization": f"Basic {METRICS_TOKEN}"}):  # fmt: skip
        r = httpx.get(url, headers=headers)
        assert r.status_code == 401, (headers, r.status_code)
        assert r.json()["code"] == 401 and "AENV_METRICS_TOKEN" in r.json()["message"]
    assert "aenv_lifecycle_seconds" in httpx.get(
        url, headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text  # fmt: skip


def test_both_roles_count_a_whole_lifecycle(
    stack: VmlessStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    api, node = stack.api_url, _node_url(stack)
    monkeypatch.setenv("E2B_API_URL", api)
    monkeypatch.setenv("E2B_API_KEY", stack.api_key)
    build_before = _scrape(api)
    name = f"obs-{uuid.uuid4().hex[:8]}"
    Template.build(Template().from_image("busybox:latest"), name)  # drives the node too
    built = _scrape(api)
    assert _delta(build_before, built, "aenv_template_build_seconds_count", result="ready") == 1
    assert _get(built, "aenv_template_build_queue") == 0
    assert _get(built, "aenv_template_builds_running") == 0

    before_api, before_node = _scrape(api), _scrape(node)
    with httpx.Client(base_url=api, headers={"X-API-KEY": stack.api_key}, timeout=30) as c:
        r = c.post("/sandboxes", json={"templateID": "base", "timeout": 300})
        assert r.status_code == 201, r.text
        sid = r.json()["sandboxID"]
        assert c.post(f"/sandboxes/{sid}/pause").status_code == 204
        assert c.post(f"/sandboxes/{sid}/resume", json={"timeout": 300}).status_code == 201
        r = c.post(f"/sandboxes/{sid}/fork", json={"count": 2})
        assert r.status_code == 201, r.text
        children = [item["sandbox"]["sandboxID"] for item in r.json()]
        r = c.post(f"/sandboxes/{sid}/snapshots", json={"name": f"{name}-snap"})
        assert r.status_code == 201, r.text

        def census() -> Samples | None:
            s = _scrape(api)
            running = _get(s, "aenv_sandboxes", state="running", node=NODE)
            return s if running == 3 else None  # the parent and its two children

        mid = eventually_sync(census, timeout=10, interval=0.2)
        assert _get(mid, "aenv_sandboxes", state="paused", node=NODE) == 0
        assert _get(mid, "aenv_sandboxes", state="creating", node=NODE) == 0
        mid_node = _scrape(node)
        assert _get(mid_node, "aenv_node_vms", node=NODE) == 3
        capacity = _get(mid_node, "aenv_node_capacity_sandboxes", node=NODE)
        assert _get(mid_node, "aenv_node_free_sandboxes", node=NODE) == capacity - 3
        assert _get(mid_node, "aenv_node_free_vcpus", node=NODE) == (
            _get(mid_node, "aenv_node_vcpus", node=NODE) - 3)  # fmt: skip
        assert _get(mid_node, "aenv_node_free_memory_mib", node=NODE) == (
            _get(mid_node, "aenv_node_memory_mib", node=NODE) - 3 * 512)  # fmt: skip
        for s in (sid, *children):
            assert c.delete(f"/sandboxes/{s}").status_code == 204
    after_api, after_node = _scrape(api), _scrape(node)

    # the node: every stage of every op, once per command (3 kills: the parent, 2 children)
    runs = {"create": 1, "pause": 1, "resume": 1, "fork": 1, "snapshot": 1, "kill": 3}
    for op, n in runs.items():
        stages = ("queue", "restore", "envd_ready", "total") if op in (
            "create", "resume", "fork") else ("queue", "total")  # fmt: skip
        for stage in stages:
            got = _delta(before_node, after_node, "aenv_lifecycle_seconds_count", op=op,
                         stage=stage, start="cold")  # fmt: skip
            assert got == n, (op, stage, got)
    assert _get(after_node, "aenv_node_vms", node=NODE) == 0
    for cause in ("oom", "crash"):
        assert _get(after_node, "aenv_vm_deaths_total", cause=cause) == 0
    assert _get(after_node, "aenv_node_vm_rss_bytes", node=NODE) == 0  # no VMs in memory
    assert _get(after_node, "aenv_node_vm_cpu_seconds_total", node=NODE) == 0
    prefix = stack.bus_settings.bus_prefix
    for consumer in (f"{prefix}_node-{NODE}", f"{prefix}_place"):
        labels = {"stream": f"{prefix.upper()}_AENV_CMD", "consumer": consumer}
        assert _get(after_node, "aenv_jetstream_consumer_pending", **labels) == 0
        assert _get(after_node, "aenv_jetstream_consumer_redelivered", **labels) == 0

    # the API: each request by its route's template and status, the read model's census
    requests = {("POST", "/sandboxes", "201"): 1, ("POST", "/sandboxes/{sandbox_id}/pause",
                "204"): 1, ("POST", "/sandboxes/{sandbox_id}/resume", "201"): 1,
                ("POST", "/sandboxes/{sandbox_id}/fork", "201"): 1,
                ("DELETE", "/sandboxes/{sandbox_id}", "204"): 3}  # fmt: skip
    for (method, route, status), n in requests.items():
        got = _delta(before_api, after_api, "aenv_api_requests_total", method=method,
                     route=route, status=status)  # fmt: skip
        assert got == n, (method, route, status, got)

    def emptied() -> bool:
        s = _scrape(api)
        return all(v == 0 for (name, _), v in s.items() if name == "aenv_sandboxes")

    eventually_sync(emptied, timeout=10, interval=0.2)
    for projection in ("sandboxes", "templates"):
        assert _get(after_api, "aenv_projection_lag_events", projection=projection) >= 0
    eventually_sync(lambda: _get(_scrape(api), "aenv_projection_lag_events",
                                 projection="sandboxes") == 0, timeout=10)  # fmt: skip
    build = {"stream": f"{prefix.upper()}_AENV_CMD", "consumer": f"{prefix}_build"}
    assert _get(after_api, "aenv_jetstream_consumer_pending", **build) == 0
    errors = {k: v for k, v in after_api.items() if k[0] == "aenv_scrape_errors_total" and v}
    assert errors == {}, errors
