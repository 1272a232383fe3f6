"""What the API reads from the nodes' heartbeats and the streams for Prometheus (issue 30):
each node's heartbeat age and upload backlog, and a stream's fill against its limits."""

from __future__ import annotations

import asyncio
import time

from prometheus_client.parser import text_string_to_metric_families

from api.metrics import Metrics
from bus.nodes import Heartbeat
from shared.stream_metrics import fill_ratio


def _by_node(text: str, name: str) -> dict[str, float]:
    return {
        s.labels["node"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    }


def test_heartbeat_age_and_upload_backlog_per_node_from_the_latest_beats() -> None:
    now = time.time()
    beats = [
        Heartbeat(node_id="n1", at=now - 2),
        Heartbeat(node_id="n2", at=now - 90, uploads_waiting=3, oldest_upload_wait_s=600.0),
    ]
    m = Metrics()
    m.watch_heartbeats(lambda: list(beats))
    text = asyncio.run(m.render()).decode()
    age = _by_node(text, "aenv_node_heartbeat_age_seconds")
    assert 2 <= age["n1"] < 10 and 90 <= age["n2"] < 100
    assert _by_node(text, "aenv_node_uploads_waiting") == {"n1": 0, "n2": 3}
    assert _by_node(text, "aenv_node_oldest_upload_wait_seconds") == {"n1": 0, "n2": 600}
    beats.pop()  # a node whose entry left the bucket: its series go with it
    text = asyncio.run(m.render()).decode()
    assert set(_by_node(text, "aenv_node_heartbeat_age_seconds")) == {"n1"}


def test_fill_is_the_fuller_limit_and_none_without_limits() -> None:
    assert fill_ratio(700, 10, 1000, -1) == 0.7
    assert fill_ratio(100, 90, 1000, 100) == 0.9
    assert fill_ratio(100, 90, -1, 0) is None
