"""Seeing the fleet (issue 20) on a stack of its own — nothing else runs commands there, so
counts are exact: both roles' `/metrics` after a build, create, pause, resume, fork,
snapshot and kill, each series with the right count; the node's `/metrics` refused without
the token; one trace per create, exported over OTLP/HTTP to a collector stand-in in this
process, spanning API → NATS → node → projection; the log lines of that create carrying
its trace and sandbox."""

from __future__ import annotations

import gzip
import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from e2b import Template
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests import series
from tests.support import eventually_sync
from tests.vmless.conftest import METRICS_TOKEN, VmlessStack, vmless_stack

NODE = "vmless"
Samples = series.Samples


class Collector:
    """An OTLP/HTTP trace receiver (what an OpenTelemetry Collector listens with on
    :4318): `POST /v1/traces` with an `ExportTraceServiceRequest` in protobuf; each span
    kept as a dict with its service."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces" and (
                    self.headers.get("Content-Type") == "application/x-protobuf"
                )
                if ok:
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    collector.take(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, request: ExportTraceServiceRequest) -> None:
        for rs in request.resource_spans:
            resource = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for span in ss.spans:
                    with self.lock:
                        self.spans.append(
                            {
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_id": span.parent_span_id.hex() or None,
                                "name": span.name,
                                "kind": span.kind,
                                "service": resource.get("service.name"),
                                "attributes": {
                                    a.key: a.value.string_value for a in span.attributes
                                },
                            }
                        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SERVER, PRODUCER, CONSUMER = 2, 4, 5  # opentelemetry.proto.trace.v1.Span.SpanKind


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, collector: Collector) -> Iterator[VmlessStack]:
    with vmless_stack(
        tmp_path_factory.mktemp("aenv-obs"),
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.url,
        OTEL_BSP_SCHEDULE_DELAY="200",
    ) as s:
        yield s


def _node_url(stack: VmlessStack) -> str:
    return series.node_url(stack.bus_settings, NODE)


def _scrape(url: str) -> Samples:
    return series.scrape(url, METRICS_TOKEN)


def _get(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, (name, labels, sorted(k for k in samples if k[0] == name)[:20])
    return samples[key]


def _delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_the_node_metrics_need_the_token(stack: VmlessStack) -> None:
    url = f"{_node_url(stack)}/metrics"
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"X-API-KEY": stack.api_key},
        {"Authorization": f"Basic {METRICS_TOKEN}"},
    ):
        r = httpx.get(url, headers=headers)
        assert r.status_code == 401, (headers, r.status_code)
        assert r.json()["code"] == 401 and "AENV_METRICS_TOKEN" in r.json()["message"]
    assert (
        "aenv_lifecycle_seconds"
        in httpx.get(url, headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text
    )


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
            _get(mid_node, "aenv_node_vcpus", node=NODE) - 3
        )
        assert _get(mid_node, "aenv_node_free_memory_mib", node=NODE) == (
            _get(mid_node, "aenv_node_memory_mib", node=NODE) - 3 * 512
        )
        for s in (sid, *children):
            assert c.delete(f"/sandboxes/{s}").status_code == 204
    after_api, after_node = _scrape(api), _scrape(node)

    # the node: every stage of every op, once per command (3 kills: the parent, 2 children)
    runs = {"create": 1, "pause": 1, "resume": 1, "fork": 1, "snapshot": 1, "kill": 3}
    for op, n in runs.items():
        stages = (
            ("queue", "restore", "envd_ready", "total")
            if op in ("create", "resume", "fork")
            else ("queue", "total")
        )
        for stage in stages:
            got = _delta(
                before_node,
                after_node,
                "aenv_lifecycle_seconds_count",
                op=op,
                stage=stage,
                start="cold",
            )
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
    requests = {
        ("POST", "/sandboxes", "201"): 1,
        ("POST", "/sandboxes/{sandbox_id}/pause", "204"): 1,
        ("POST", "/sandboxes/{sandbox_id}/resume", "201"): 1,
        ("POST", "/sandboxes/{sandbox_id}/fork", "201"): 1,
        ("DELETE", "/sandboxes/{sandbox_id}", "204"): 3,
    }
    for (method, route, status), n in requests.items():
        got = _delta(
            before_api,
            after_api,
            "aenv_api_requests_total",
            method=method,
            route=route,
            status=status,
        )
        assert got == n, (method, route, status, got)

    def emptied() -> bool:
        s = _scrape(api)
        return all(v == 0 for (name, _), v in s.items() if name == "aenv_sandboxes")

    eventually_sync(emptied, timeout=10, interval=0.2)
    for projection in ("sandboxes", "templates"):
        assert _get(after_api, "aenv_projection_lag_events", projection=projection) >= 0
    eventually_sync(
        lambda: _get(_scrape(api), "aenv_projection_lag_events", projection="sandboxes") == 0,
        timeout=10,
    )
    build = {"stream": f"{prefix.upper()}_AENV_CMD", "consumer": f"{prefix}_build"}
    assert _get(after_api, "aenv_jetstream_consumer_pending", **build) == 0
    errors = {k: v for k, v in after_api.items() if k[0] == "aenv_scrape_errors_total" and v}
    assert errors == {}, errors
    # the node's disk walk ran (its state dir holds at least its journal)
    disk = [v for (name, _), v in after_node.items() if name == "aenv_node_disk_bytes"]
    assert sum(disk) > 0, disk
    # every series the catalogue (and so the dashboard and the docs) names, found here
    found_api = {name for name, _ in after_api}
    found_node = {name for name, _ in after_node}
    api_series = series.samples({**series.API, **series.COMMON})
    node_series = series.samples({**series.NODE, **series.COMMON})
    assert api_series <= found_api, api_series - found_api
    assert node_series <= found_node, node_series - found_node
    ours = {n for n in found_api | found_node if n.startswith("aenv_")}
    # (a node without VMs keeps no warm pool: its warm series say so, at zero; tests/e2e
    # finds them with VMs)
    assert ours <= api_series | node_series | series.samples(series.WARM), (
        "a series the catalogue lacks"
    )


def test_one_create_is_one_trace_from_the_api_to_the_read_model(
    stack: VmlessStack, collector: Collector
) -> None:
    with httpx.Client(
        base_url=stack.api_url, headers={"X-API-KEY": stack.api_key}, timeout=30
    ) as c:
        r = c.post("/v2/sandboxes", json={"templateID": "base"})
        assert r.status_code == 201, r.text
        sid = r.json()["sandboxID"]
        assert c.delete(f"/sandboxes/{sid}").status_code == 204

    def tree() -> list[dict[str, Any]] | None:
        with collector.lock:
            spans = list(collector.spans)
        ours = {s["trace_id"] for s in spans if s["name"].endswith(f"aenv.evt.sandbox.{sid}")}
        roots = [
            s
            for s in spans
            if s["kind"] == SERVER and s["trace_id"] in ours and s["name"] == "POST /v2/sandboxes"
        ]
        if len(roots) != 1:
            return None
        trace = [s for s in spans if s["trace_id"] == roots[0]["trace_id"]]
        group = "messaging.consumer.group.name"
        projected = any(
            s["kind"] == CONSUMER and s["attributes"].get(group, "").startswith("projection:")
            for s in trace
        )
        # each process exports its batches on its own: wait for the node's too (the span
        # of its handling ends last, after those of its appends)
        handled = any(
            s["kind"] == CONSUMER and s["name"].endswith("aenv.cmd.place.create") for s in trace
        )
        return trace if projected and handled else None

    trace = eventually_sync(tree, timeout=20, interval=0.2)
    by_id = {s["span_id"]: s for s in trace}

    def parent(s: dict[str, Any]) -> dict[str, Any] | None:
        return by_id.get(s["parent_id"] or "")

    (root,) = [s for s in trace if s["kind"] == SERVER]
    assert root["service"] == "aenv-api" and root["parent_id"] is None
    assert root["attributes"]["http.route"] == "/v2/sandboxes"
    (send,) = [
        s for s in trace if s["kind"] == PRODUCER and s["name"].endswith("aenv.cmd.place.create")
    ]
    (handle,) = [
        s for s in trace if s["kind"] == CONSUMER and s["name"].endswith("aenv.cmd.place.create")
    ]
    assert parent(send) is root and parent(handle) is send
    assert handle["service"] == "aenv-node"
    appends = [s for s in trace if s["kind"] == PRODUCER and s["name"].endswith(sid)]
    assert len(appends) >= 2 and all(parent(a) is handle for a in appends)  # requested, created
    assert all(a["service"] == "aenv-node" for a in appends)
    restore = [s for s in trace if s["name"] == "restore sandbox VM"]
    assert len(restore) == 1 and parent(restore[0]) is handle
    # the projectors' (the node's own consumers of the log — snapshot uploads, volume
    # releases — see the same events, in spans of their own)
    projected = [
        s
        for s in trace
        if s["kind"] == CONSUMER
        and s["name"].endswith(sid)
        and s["attributes"].get("messaging.consumer.group.name", "").startswith("projection:")
    ]
    assert projected and all(parent(p) in appends for p in projected)
    assert all(p["service"] == "aenv-api" for p in projected)
    # the read model's statements, traced by SQLAlchemy's instrumentation under the batch
    sql = [s for s in trace if parent(s) in projected]
    assert sql and all(s["attributes"].get("db.system") in ("postgresql", None) for s in sql)

    # the node's log line for this create names its trace and its sandbox
    def logged() -> dict[str, Any] | None:
        for line in (stack.data_dir / "aenv.log").read_text().splitlines():
            rec = json.loads(line)
            if rec.get("trace_id") == root["trace_id"] and rec.get("sandbox_id") == sid:
                return dict(rec)
        return None

    rec = eventually_sync(logged, timeout=10, interval=0.2)
    assert rec["service"] == "aenv-node" and rec["span_id"] == handle["span_id"]
