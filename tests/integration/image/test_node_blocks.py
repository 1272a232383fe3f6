"""The node role's block service start (`aenv/roles/node.py::_block_service`), no VM: the
chunk cache's cap is held in the node's disk budget and, when the budget cannot hold the
setting, the real service is started with the lowered cap; when the budget's room changes,
the running service is given a new cap (issue 29)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from aenv.roles import node as node_role
from aenv.roles.node import _block_service
from tests.support import eventually
from workers.node.blockservice import answers
from workers.node.disk.node import NodeDisk
from workers.node.metrics import NodeMetrics
from workers.node.settings import NodeSettings

MiB = 1 << 20


async def test_a_lazy_node_holds_its_chunk_cache_in_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AENV_S3_ENDPOINT", raising=False)
    monkeypatch.setenv("AENV_SNAPSHOT_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("AENV_IMAGE_CACHE", str(tmp_path / "cache"))
    cfg = NodeSettings(
        node_id="n1",
        state_dir=tmp_path / "state",
        lazy_images="on",
        blocks_cache_bytes=4096 * MiB,
        disk_budget_bytes=600 * MiB,
        disk_headroom_bytes=100 * MiB,
    )
    monkeypatch.setattr(node_role, "REFIT_EVERY_S", 0.2)
    disk = NodeDisk(cfg, tmp_path / "cache")
    free = disk.budget.free()
    assert 490 * MiB <= free <= 500 * MiB
    async with contextlib.AsyncExitStack() as stack:
        service, lazy = await _block_service(cfg, stack, NodeMetrics("n1"), disk)
        assert service is not None and lazy is not None and service.pid is not None
        assert await answers(service.socket)
        argv = Path(f"/proc/{service.pid}/cmdline").read_bytes().split(b"\0")
        cap = int(argv[argv.index(b"--cache-bytes") + 1])
        assert abs(cap - free // 2) <= MiB  # lowered: half the free room
        assert abs(disk.budget.free() - (free - cap)) <= MiB  # and held in the budget

        # the budget's room changes while both run: the node fits the cap again, and the
        # running service takes it (its stats say the cap in force)
        image = tmp_path / "cache" / "images" / ("ab" * 32) / "root.ext4"
        image.parent.mkdir(parents=True)
        image.write_bytes(os.urandom(200 * MiB))
        disk.budget.walk()
        stats = cfg.blocks_dir / "stats.json"

        async def lowered() -> bool:
            return json.loads(stats.read_text())["cache_cap_bytes"] < cap - 64 * MiB

        await eventually(lowered, timeout=20)
        now = json.loads(stats.read_text())["cache_cap_bytes"]
        assert abs(now - (free - 200 * MiB) // 2) <= 2 * MiB  # half of what is left
        assert abs(disk.budget.free() - (free - 200 * MiB - now)) <= 2 * MiB
    assert not await answers(service.socket)  # no VM reads through it: stopped with the node
    assert abs(disk.budget.free() - (free - 200 * MiB)) <= 2 * MiB  # the hold goes with it
