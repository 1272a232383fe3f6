"""What a node's warm pool holds, read as an operator would: its readiness answer."""

from __future__ import annotations

import asyncio

import httpx

from tests.e2e.conftest import Stack


def node_warm(stack: Stack) -> dict[str, int]:
    """Warm VMs per template on the stack's node now (its readiness answer on its proxy
    port, which also says nothing is wrong with its VMs' caps: each in a cgroup of its
    own, under the node's own cgroup)."""
    from aenv.ops.fleet import read_beats

    (beat,) = asyncio.run(read_beats(stack.nats_url))
    doc = httpx.get(f"http://{beat.proxy}/health/ready", timeout=10).json()
    assert doc["warnings"] == [], doc["warnings"]
    return dict(doc["warm"])
