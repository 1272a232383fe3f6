"""Capacity-aware placement on the real stack (node host in memory): a node takes creates
while its memory and vCPUs have room for them, says its room in every heartbeat, and a
create no node can take is refused at once with E2B's 503 body — not held until the
create's timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from bus import Bus
from bus.nodes import Heartbeat, NodeBook
from tests.support import eventually_sync
from tests.vmless.conftest import VmlessStack, vmless_stack


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    """A node with room for two `base` sandboxes (1 vCPU / 512 MiB each): 1024 MiB,
    4 vCPUs, no overcommit."""
    with vmless_stack(
        tmp_path_factory.mktemp("aenv-placement"),
        AENV_MEMORY_MIB="1024",
        AENV_VCPUS="4",
        AENV_MEMORY_OVERCOMMIT="1",
        AENV_CPU_OVERCOMMIT="1",
    ) as stack:
        yield stack


def _beat(stack: VmlessStack) -> Heartbeat:
    async def read() -> Heartbeat:
        bus = await Bus.connect(stack.bus_settings, setup=False)
        try:
            book = await NodeBook.open(bus.js, bus.names.nodes_bucket)
            beat = await book.heartbeat("vmless")
            assert beat is not None
            return beat
        finally:
            await bus.close()

    return asyncio.run(read())


def _create(c: httpx.Client) -> httpx.Response:
    return c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 120})


def test_a_full_node_refuses_at_once_and_takes_again_after_a_kill(small: VmlessStack) -> None:
    with httpx.Client(
        base_url=small.api_url, headers={"X-API-KEY": small.api_key}, timeout=60
    ) as c:
        first = [_create(c) for _ in range(2)]
        assert [r.status_code for r in first] == [201, 201], [r.text for r in first]
        t0 = time.monotonic()
        full = _create(c)
        took = time.monotonic() - t0
        assert full.status_code == 503, full.text
        body = full.json()
        assert body["code"] == 503 and "room" in body["message"], body
        assert full.headers["retry-after"] == "5"
        assert took < 15, f"a full fleet answered after {took:.1f} s"  # placement: 10 s
        beat = eventually_sync(lambda: (b := _beat(small)).free_mem_mib == 0 and b, timeout=10)
        assert beat and (beat.mem_mib, beat.vcpus, beat.running) == (1024, 4, 2)
        assert beat.free_vcpus == 2 and beat.free == 30
        assert beat.templates == ("base",)  # its captures: placement prefers it for them
        # what its data dirs allocate, from its disk walk (a memory host: its state dir)
        assert beat.disk_used is not None and beat.disk_used > 0, beat.disk_used
        # its one disk budget (a share of the filesystem), and room under it
        assert beat.disk_budget is not None and beat.disk_budget > beat.disk_used
        assert beat.disk_room is not None and 0 < beat.disk_room <= beat.disk_budget
        assert beat.disk_pinned == 0  # a memory host: no image cache, nothing in use
        # the refusal came from the heartbeat now: at once
        t0 = time.monotonic()
        assert _create(c).status_code == 503
        assert time.monotonic() - t0 < 1.0
        # a fork needs room for its children too: the fork answers, its children failed
        parent = first[0].json()["sandboxID"]
        fork = c.post(f"/sandboxes/{parent}/fork", json={"count": 1})
        assert fork.status_code in (201, 503), fork.text
        if fork.status_code == 201:
            [child] = fork.json()
            assert "room" in (child.get("error") or ""), child
        assert c.delete(f"/sandboxes/{first[1].json()['sandboxID']}").status_code == 204
        again = eventually_sync(
            lambda: (r := _create(c)).status_code == 201 and r, timeout=15, interval=0.5
        )
        assert again
        for r in (first[0], again):
            c.delete(f"/sandboxes/{r.json()['sandboxID']}")
