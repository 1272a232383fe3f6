"""Every Prometheus series aenv exports, by the role that serves it — what the metrics tests
found in real scrapes (each test asserts its part: `tests/vmless/test_observability.py` the
API's and the node's, `tests/contract/snapshot/test_repository_contract.py` the snapshot
transfers, which need a repository, `tests/integration/bus/test_repository_gc.py` the
repository GC's) and what the dashboard (`deploy/grafana/`) and the
documentation (`docs/observability.md`) may name (`tests/deploy/test_grafana.py`)."""

from __future__ import annotations

import asyncio
from typing import Literal

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bus import Bus, BusSettings
from bus.nodes import NodeBook

Kind = Literal["counter", "gauge", "histogram"]

API: dict[str, Kind] = {
    "aenv_api_requests": "counter",
    "aenv_api_request_seconds": "histogram",
    "aenv_sandboxes": "gauge",
    "aenv_projection_lag_events": "gauge",
    "aenv_template_build_queue": "gauge",
    "aenv_template_builds_running": "gauge",
    "aenv_template_build_seconds": "histogram",
    "aenv_jetstream_stream_bytes": "gauge",
    "aenv_jetstream_stream_messages": "gauge",
    "aenv_jetstream_stream_max_bytes": "gauge",
    "aenv_jetstream_stream_max_messages": "gauge",
    "aenv_jetstream_stream_fill_ratio": "gauge",
    "aenv_node_heartbeat_age_seconds": "gauge",
    "aenv_node_uploads_waiting": "gauge",
    "aenv_node_oldest_upload_wait_seconds": "gauge",
    "aenv_admission_refusals": "counter",
    "aenv_lease_expiries": "counter",
}
NODE: dict[str, Kind] = {
    "aenv_lifecycle_seconds": "histogram",
    "aenv_vm_deaths": "counter",
    "aenv_image_builds": "counter",
    "aenv_image_fleet_builds": "counter",
    "aenv_image_fetches": "counter",
    "aenv_image_fetch_bytes": "counter",
    "aenv_image_fetch_seconds": "counter",
    "aenv_node_capacity_sandboxes": "gauge",
    "aenv_node_free_sandboxes": "gauge",
    "aenv_node_vcpus": "gauge",
    "aenv_node_free_vcpus": "gauge",
    "aenv_node_memory_mib": "gauge",
    "aenv_node_free_memory_mib": "gauge",
    "aenv_node_vms": "gauge",
    "aenv_node_paused_sandboxes": "gauge",
    "aenv_node_vm_rss_bytes": "gauge",
    "aenv_node_guest_memory_bytes": "gauge",
    "aenv_node_guest_ram_bytes": "gauge",
    "aenv_node_vms_uncapped": "gauge",
    "aenv_node_vm_cpu_seconds": "counter",
    "aenv_node_ram_pool_bytes": "gauge",
    "aenv_node_ram_pool_files": "gauge",
    "aenv_node_ram_pool_budget_bytes": "gauge",
    "aenv_node_disk_bytes": "gauge",
    "aenv_node_disk_budget_bytes": "gauge",
    "aenv_node_disk_room_bytes": "gauge",
    "aenv_node_disk_pinned_bytes": "gauge",
}
#: the node's warm pool (a node that runs VMs: `tests/e2e/test_warm.py` finds them)
WARM: dict[str, Kind] = {
    "aenv_node_warm_vms": "gauge",
    "aenv_node_warm_memory_mib": "gauge",
    "aenv_node_warm_rss_bytes": "gauge",
    "aenv_node_warm_claims": "counter",
}
#: both roles
COMMON: dict[str, Kind] = {
    "aenv_jetstream_consumer_pending": "gauge",
    "aenv_jetstream_consumer_ack_pending": "gauge",
    "aenv_jetstream_consumer_redelivered": "gauge",
    "aenv_scrape_errors": "counter",
    "aenv_task_restarts": "counter",
}
#: the node's, when it has a snapshot repository (S3)
SNAPSHOT: dict[str, Kind] = {
    "aenv_snapshot_transfer_bytes": "counter",
    "aenv_snapshot_transfer_seconds": "histogram",
    "aenv_snapshot_transfer_failures": "counter",
}
#: the node's, when it has a repository: its janitor and GC
#: (`tests/integration/bus/test_repository_gc.py`)
REPOSITORY_GC: dict[str, Kind] = {
    "aenv_repository_gc_deleted": "counter",
    "aenv_repository_gc_deleted_bytes": "counter",
    "aenv_repository_gc_rounds": "counter",
    "aenv_repository_manifests_deleted": "counter",
}
#: the node's, with lazy images on: its block service (`tests/fleet/test_lazy_images.py`)
BLOCKS: dict[str, Kind] = {
    "aenv_blocks_hits": "counter",
    "aenv_blocks_misses": "counter",
    "aenv_blocks_fetch_bytes": "counter",
    "aenv_blocks_fetch_seconds": "counter",
    "aenv_blocks_read_bytes": "counter",
    "aenv_blocks_evictions": "counter",
    "aenv_blocks_cached_bytes": "gauge",
    "aenv_blocks_restarts": "counter",
    "aenv_blocks_prefetched_chunks": "counter",
    "aenv_blocks_prefetched_bytes": "counter",
    "aenv_blocks_traces_recorded": "counter",
    "aenv_blocks_traces_loaded": "counter",
}
FAMILIES: dict[str, Kind] = {
    **API,
    **NODE,
    **WARM,
    **COMMON,
    **SNAPSHOT,
    **REPOSITORY_GC,
    **BLOCKS,
}

#: Gauges of one fleet-wide value that every instance exports alike (each API reads the
#: same read model, nodes bucket and streams; every node reports the shared `place`
#: consumer): summing them counts the value once per instance (x2 on compose, x3 on
#: Kubernetes). Dashboards and rules take max/min/avg over them
#: (`tests/deploy/promql.py`).
FLEET_WIDE = frozenset(
    {
        "aenv_sandboxes",
        "aenv_projection_lag_events",
        "aenv_template_build_queue",
        "aenv_jetstream_consumer_pending",
        "aenv_jetstream_consumer_ack_pending",
        "aenv_jetstream_consumer_redelivered",
        "aenv_jetstream_stream_bytes",
        "aenv_jetstream_stream_messages",
        "aenv_jetstream_stream_max_bytes",
        "aenv_jetstream_stream_max_messages",
        "aenv_jetstream_stream_fill_ratio",
        "aenv_node_heartbeat_age_seconds",
        "aenv_node_uploads_waiting",
        "aenv_node_oldest_upload_wait_seconds",
    }
)


def samples(families: dict[str, Kind]) -> set[str]:
    """The sample names the families expose (a counter's `_total`, a histogram's
    `_bucket`, `_sum`, `_count`)."""
    out: set[str] = set()
    for name, kind in families.items():
        if kind == "counter":
            out.add(f"{name}_total")
        elif kind == "histogram":
            out |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            out.add(name)
    return out


#: (name, labels) → value of every sample of a scrape
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str, token: str) -> Samples:
    """`url`'s `/metrics` with the metrics token, every sample (the parser raises on a
    malformed line)."""
    r = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(r.text)
        for s in f.samples
    }


def node_url(settings: BusSettings, node_id: str) -> str:
    """Where a node serves its proxy port (`/metrics` among it), from its heartbeat."""

    async def read() -> str:
        bus = await Bus.connect(settings, setup=False)
        try:
            beat = await (await NodeBook.open(bus.js, bus.names.nodes_bucket)).heartbeat(node_id)
            assert beat is not None and beat.proxy, f"node {node_id} does not beat"
            return f"http://{beat.proxy}"
        finally:
            await bus.close()

    return asyncio.run(read())
