"""Placement around a cordoned node (`api/room.py`, `api/mounts.py`): its heartbeat says it
is cordoned, and the API neither counts its room, nor hints it for a warm VM or a held
capture, nor sends a volume's create there; a fleet of cordoned nodes is a clear 503."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from api.errors import ApiError
from api.mounts import preferred_node
from api.room import check_room, held_nodes, warm_nodes
from bus.nodes import Heartbeat, takes_new

GIB = 1 << 30


def _ctx(*beats: Heartbeat) -> Any:
    book = SimpleNamespace(current=lambda: {b.node_id: b for b in beats})
    return SimpleNamespace(nodes=book, settings=SimpleNamespace(disk_headroom_bytes=GIB))


def _beat(node: str, *, cordoned: bool = False, free_mem: int = 4096, at: float = 0) -> Heartbeat:
    return Heartbeat(
        node_id=node,
        at=at or time.time(),
        capacity=8,
        free=8,
        vcpus=8,
        mem_mib=4096,
        free_vcpus=8,
        free_mem_mib=free_mem,
        warm={"base": 1},
        templates=("base",),
        cordoned=cordoned,
    )


def test_a_cordoned_or_gone_node_takes_nothing_new() -> None:
    now = time.time()
    assert takes_new(_beat("a"), now)
    assert not takes_new(_beat("a", cordoned=True), now)
    assert not takes_new(_beat("a", at=now - 3600), now)


def test_hints_skip_a_cordoned_node() -> None:
    ctx = _ctx(_beat("n1", cordoned=True), _beat("n2"))
    assert warm_nodes(ctx, "base") == ("n2",)
    assert held_nodes(ctx, "base") == ("n2",)


def test_room_on_a_cordoned_node_does_not_count() -> None:
    # the roomy node is cordoned; the other is full: no node can take it
    ctx = _ctx(_beat("n1", cordoned=True), _beat("n2", free_mem=100))
    with pytest.raises(ApiError) as refused:
        check_room(ctx, 1, 512)
    assert refused.value.status == 503 and "(n2)" in refused.value.message
    check_room(_ctx(_beat("n1", cordoned=True), _beat("n2")), 1, 512)  # n2 has room


def test_every_node_cordoned_is_a_503_that_says_so() -> None:
    with pytest.raises(ApiError) as refused:
        check_room(_ctx(_beat("n1", cordoned=True)), 1, 512)
    assert refused.value.status == 503
    assert refused.value.message.startswith("every running node is cordoned")
    with pytest.raises(ApiError) as child:  # a fork's children start beside the parent
        check_room(_ctx(_beat("n1", cordoned=True), _beat("n2")), 1, 512, node="n1")
    assert child.value.message.startswith("node n1 is cordoned")


def test_a_volume_create_does_not_prefer_a_cordoned_node() -> None:
    version = SimpleNamespace(node_id="n1")
    volumes: Any = [SimpleNamespace(version=version)]
    assert preferred_node(_ctx(_beat("n1"), _beat("n2")), volumes) == "n1"
    assert preferred_node(_ctx(_beat("n1", cordoned=True), _beat("n2")), volumes) is None


async def test_a_resume_stranded_on_a_gone_node_says_when_to_retry() -> None:
    """Issue 32: every 503 of a create or a resume for want of a node carries Retry-After."""
    from api.resume import node_or_placement

    async def gone(_: str) -> bool:
        return True

    ctx: Any = SimpleNamespace(node_gone=gone)
    with pytest.raises(ApiError) as e:
        await node_or_placement(ctx, "n1", durable=False, stranded="stranded on n1")
    assert e.value.status == 503 and e.value.headers == {"Retry-After": "5"}
    assert await node_or_placement(ctx, "n1", durable=True, stranded="x") is None
