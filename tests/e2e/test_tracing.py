"""One create's trace crosses every hop: API (SERVER) → command publish (PRODUCER) → node
(CONSUMER) → event appends (PRODUCER) → read model (CONSUMER), all in one trace."""

from __future__ import annotations

import json
from typing import Any

import pytest
from e2b import Sandbox

from tests.e2e.conftest import Stack
from tests.support import eventually_sync

pytestmark = pytest.mark.vm


def _spans(stack: Stack) -> list[dict[str, Any]]:
    path = stack.data_dir / "traces.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_create_trace_spans_api_bus_node_and_projection(stack: Stack) -> None:
    sbx = Sandbox.create()
    sid = sbx.sandbox_id
    sbx.kill()

    def tree() -> list[dict[str, Any]] | None:
        spans = _spans(stack)
        ours = {x["trace_id"] for x in spans if sid in x["name"]}
        roots = [
            s
            for s in spans
            if s["kind"] == "SERVER" and s["name"] == "POST /v2/sandboxes" and s["trace_id"] in ours
        ]
        if not roots:
            return None
        trace = [s for s in spans if s["trace_id"] == roots[-1]["trace_id"]]
        group = "messaging.consumer.group.name"
        projected = [
            s
            for s in trace
            if s["kind"] == "CONSUMER" and s["attributes"].get(group, "").startswith("projection:")
        ]
        # each process exports its spans in batches of its own: the node's handling span
        # (it ends after its appends) may come after the API's projection spans
        handled = any(s["name"] == "process aenv.cmd.place.create" for s in trace)
        return trace if projected and handled else None

    trace = eventually_sync(tree, timeout=20, interval=0.2)
    by_id = {s["span_id"]: s for s in trace}

    def parent(s: dict[str, Any]) -> dict[str, Any] | None:
        return by_id.get(s["parent_id"] or "")

    root = next(s for s in trace if s["kind"] == "SERVER")
    send_cmd = next(s for s in trace if s["name"] == "send aenv.cmd.place.create")
    handle = next(s for s in trace if s["name"] == "process aenv.cmd.place.create")
    appends = [s for s in trace if s["name"] == f"send aenv.evt.sandbox.{sid}"]
    projected = [s for s in trace if s["kind"] == "CONSUMER" and s["name"].endswith(sid)]
    assert parent(send_cmd) is root
    assert parent(handle) is send_cmd
    assert len(appends) >= 2 and all(parent(a) in (handle, *trace) for a in appends)
    assert any(parent(a) is handle for a in appends)  # the requested/created events
    assert any(s["name"] == "restore sandbox VM" and parent(s) is handle for s in trace)
    assert projected and all(parent(p) in appends for p in projected)
