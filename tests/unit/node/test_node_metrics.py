"""The node's series without a node (issue 20): stages of an operation, what procfs says
its VMs cost, why a VM died."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from domain import sandbox as sb
from workers.node.capacity import Room
from workers.node.disk import CATEGORIES, Tally
from workers.node.memory import MemoryHost
from workers.node.metrics import NodeMetrics
from workers.node.ports import GuestConfig
from workers.node.usage import CpuTally, read_usage
from workers.node.vmm.limits import Applied, oom_kills


def _samples(m: NodeMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = asyncio.run(m.scrape.render()).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def _count(m: NodeMetrics, op: str, stage: str) -> float:
    key = (
        "aenv_lifecycle_seconds_count",
        frozenset({"op": op, "stage": stage, "start": "cold"}.items()),
    )
    return _samples(m)[key]


def test_an_operation_counts_its_queue_and_total_only_when_done() -> None:
    m = NodeMetrics("n1")
    kill = sb.KillSandbox(sandbox_id="abc")
    stored = datetime.now(UTC) - timedelta(seconds=2)
    with m.operation(kill, stored):
        assert _count(m, "kill", "queue") == 0 and _count(m, "kill", "total") == 0
    assert _count(m, "kill", "queue") == 1 and _count(m, "kill", "total") == 1
    s = _samples(m)
    labels = frozenset({"op": "kill", "stage": "queue", "start": "cold"}.items())
    queue_sum = s[("aenv_lifecycle_seconds_sum", labels)]
    assert 2.0 <= queue_sum < 10
    with pytest.raises(RuntimeError), m.operation(kill, stored):
        raise RuntimeError("passed on: no room")
    assert _count(m, "kill", "queue") == 1 and _count(m, "kill", "total") == 1


def test_a_create_a_warm_vm_took_is_labelled_warm() -> None:
    m = NodeMetrics("n1")
    create = sb.CreateSandbox(sandbox_id="abc", template_id="base")
    with m.operation(create, datetime.now(UTC), warm=lambda sid: sid == "abc"):
        pass
    s = _samples(m)
    warm = frozenset({"op": "create", "stage": "total", "start": "warm"}.items())
    assert s[("aenv_lifecycle_seconds_count", warm)] == 1
    assert _count(m, "create", "total") == 0  # not counted as cold too


def test_every_op_and_its_stages_exist_before_the_first_one() -> None:
    m = NodeMetrics("n1")
    for op in ("create", "resume", "fork"):
        for stage in ("queue", "restore", "envd_ready", "total"):
            assert _count(m, op, stage) == 0
    for op in ("pause", "snapshot", "kill"):
        for stage in ("queue", "total"):
            assert _count(m, op, stage) == 0
    s = _samples(m)
    assert s[("aenv_vm_deaths_total", frozenset({("cause", "oom")}))] == 0
    m.died("crash")
    m.died("something new")  # an unknown cause counts as a crash: the label set stays closed
    assert _samples(m)[("aenv_vm_deaths_total", frozenset({("cause", "crash")}))] == 2


def test_the_memory_host_times_its_starts_as_stages() -> None:
    m = NodeMetrics("n1")
    host = MemoryHost(capacity=4)
    host.on_stage(m.stage)
    asyncio.run(host.create("s1", "base", GuestConfig()))
    assert _count(m, "create", "restore") == 1 and _count(m, "create", "envd_ready") == 1


def test_room_and_vms_are_read_at_the_scrape() -> None:
    m = NodeMetrics("n1")
    host = MemoryHost(capacity=4)
    room = Room(
        vcpus=32, mem_mib=3072, sandboxes=4, free_vcpus=31, free_mem_mib=2560, free_sandboxes=3
    )
    m.watch(host, lambda: room)
    s = _samples(m)
    node = frozenset({("node", "n1")})
    assert s[("aenv_node_capacity_sandboxes", node)] == 4
    assert s[("aenv_node_free_memory_mib", node)] == 2560
    assert s[("aenv_node_free_vcpus", node)] == 31
    assert s[("aenv_node_vms", node)] == 0 and s[("aenv_node_vm_rss_bytes", node)] == 0


def test_disk_bytes_are_the_last_walks_and_absent_before_one() -> None:
    m = NodeMetrics("n1")
    room = Room(vcpus=1, mem_mib=512, sandboxes=1, free_vcpus=1, free_mem_mib=512, free_sandboxes=1)
    last: list[Tally] = []
    m.watch(MemoryHost(capacity=1), lambda: room, lambda: last[-1] if last else None)
    assert not [k for k in _samples(m) if k[0] == "aenv_node_disk_bytes"]
    last.append(Tally({**dict.fromkeys(CATEGORIES, 0), "image": 4096, "vm": 8192}))
    s = _samples(m)
    disk = {dict(k[1])["category"]: v for k, v in s.items() if k[0] == "aenv_node_disk_bytes"}
    assert disk == {**dict.fromkeys(CATEGORIES, 0), "image": 4096, "vm": 8192}


def test_procfs_usage_of_a_live_process() -> None:
    u = read_usage(os.getpid())
    assert u is not None and u.rss_bytes > 1 << 20 and u.cpu_s > 0
    assert read_usage(2**22 + 7) is None  # no such pid


def test_cpu_of_gone_vms_stays_counted() -> None:
    tally = CpuTally()
    assert tally.total([(10, 1.0), (11, 2.0)]) == 3.0
    assert tally.total([(10, 1.5)]) == 3.5  # 11 is gone: its 2.0 stays
    assert tally.total([(10, 0.25)]) == 3.75  # pid 10 reused by a new VM
    assert tally.total([]) == 3.75


def test_oom_kills_from_either_cgroup_version(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir()
    v1.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert oom_kills(Applied((v2,))) == 1
    assert oom_kills(Applied((v1, tmp_path))) == 2
    assert oom_kills(Applied((tmp_path,))) == 0 and oom_kills(None) == 0
