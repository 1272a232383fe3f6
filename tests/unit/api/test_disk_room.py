"""The API's side of placement by disk (`api/room.py`): a create is refused at once when
no live node with memory room has disk room for its template, with a message naming the
disk; `held_on` keeps only holders with room for the headroom; memory comes first."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from api.errors import ApiError
from api.room import check_room, disk_need, held_nodes
from bus.nodes import Heartbeat

GIB = 1 << 30


def _ctx(*beats: Heartbeat) -> Any:
    book = SimpleNamespace(current=lambda: {b.node_id: b for b in beats})
    return SimpleNamespace(nodes=book, settings=SimpleNamespace(disk_headroom_bytes=GIB))


def _beat(node: str, room: int | None, *held: str, free_mem: int = 4096) -> Heartbeat:
    return Heartbeat(
        node_id=node,
        at=time.time(),
        capacity=8,
        free=8,
        vcpus=8,
        mem_mib=4096,
        free_vcpus=8,
        free_mem_mib=free_mem,
        disk_room=room,
        templates=held,
    )


TPL = {"template_id": "big", "capture_bytes": GIB, "image_bytes": 3 * GIB}


def test_the_need_comes_from_the_template_row_and_the_headroom_setting() -> None:
    need = disk_need(_ctx(), TPL)
    assert (need.template_id, need.fetched, need.headroom) == ("big", 4 * GIB, GIB)
    old = disk_need(_ctx(), {"template_id": "old", "capture_bytes": None})
    assert old.fetched == 0  # a row from before sizes were recorded


def test_no_node_with_disk_room_is_a_503_naming_the_disk() -> None:
    ctx = _ctx(_beat("a", 2 * GIB), _beat("b", 4 * GIB))
    with pytest.raises(ApiError) as refused:
        check_room(ctx, 1, 512, disk=disk_need(ctx, TPL))
    e = refused.value
    assert e.status == 503 and e.headers == {"Retry-After": "5"}
    assert e.message.startswith("no node has disk room for template big: needs 5368709120")
    assert "largest room 4294967296 bytes on b" in e.message


def test_one_node_with_room_or_holding_it_or_not_saying_is_enough() -> None:
    for other in (_beat("b", 5 * GIB), _beat("b", GIB, "big"), _beat("b", None)):
        ctx = _ctx(_beat("a", 0), other)
        check_room(ctx, 1, 512, disk=disk_need(ctx, TPL))


def test_memory_is_refused_first_and_a_node_without_memory_room_lends_no_disk() -> None:
    ctx = _ctx(_beat("a", 100 * GIB, free_mem=0), _beat("b", 0))
    with pytest.raises(ApiError) as refused:
        check_room(ctx, 1, 512, disk=disk_need(ctx, TPL))
    assert "largest room 0 bytes on b" in refused.value.message  # a has no memory left
    full = _ctx(_beat("a", 100 * GIB, free_mem=0))
    with pytest.raises(ApiError) as no_memory:
        check_room(full, 1, 512, disk=disk_need(full, TPL))
    assert "no node has room for 1 sandbox" in no_memory.value.message


def test_held_on_keeps_holders_with_room_for_the_headroom() -> None:
    ctx = _ctx(_beat("a", GIB, "big"), _beat("b", GIB - 1, "big"), _beat("c", None, "big"))
    assert held_nodes(ctx, "big", disk_need(ctx, TPL)) == ("a", "c")
    assert held_nodes(ctx, "big") == ("a", "b", "c")
