"""`aenv status`'s fleet: nodes with their room, totals, and the placement skew."""

from aenv.ops.fleet import fleet_view
from bus.nodes import Heartbeat


def _beat(node: str, at: float, running: int, paused: int = 0) -> Heartbeat:
    return Heartbeat(
        node_id=node,
        at=at,
        every_s=5,
        capacity=32,
        free=32 - running,
        running=running,
        paused=paused,
        vcpus=8,
        mem_mib=4096,
        free_vcpus=8 - running,
        free_mem_mib=4096 - 512 * running,
        accelerator="tcg",
    )


def test_nodes_totals_and_skew() -> None:
    view = fleet_view([_beat("b", 100, 2, 1), _beat("a", 100, 6), _beat("c", 10, 9)], now=101)
    assert [n["node"] for n in view["nodes"]] == ["a", "b", "c"]
    assert [n["state"] for n in view["nodes"]] == ["beating", "beating", "gone"]
    assert (view["beating"], view["gone"], view["running"], view["paused"]) == (2, 1, 8, 1)
    assert view["placement_skew"] == 1.5  # 6 over a mean of 4
    a = view["nodes"][0]
    assert a["room"] == {
        "vcpus": 8,
        "free_vcpus": 2,
        "mem_mib": 4096,
        "free_mem_mib": 1024,
        "sandboxes": 32,
        "free_sandboxes": 26,
    }
    # its disk: none said (a node with no budget, or from before disk accounting)
    assert a["disk"] == {"used": None, "budget": None, "room": None, "pinned": None}


def test_an_empty_fleet() -> None:
    view = fleet_view([], now=0)
    assert view["nodes"] == [] and view["beating"] == 0 and view["placement_skew"] is None


def test_disk_used_and_budget_per_node() -> None:
    beat = _beat("a", 100, 1).model_copy(
        update={"disk_used": 3 << 30, "disk_budget": 8 << 30, "disk_room": 6 << 30}
    )
    view = fleet_view([beat, _beat("b", 100, 0)], now=101)
    assert view["nodes"][0]["disk"] == {
        "used": 3 << 30,
        "budget": 8 << 30,
        "room": 6 << 30,
        "pinned": None,
    }
    assert view["nodes"][1]["disk"]["budget"] is None  # a node from before the budget


def test_a_cordoned_node_says_so() -> None:
    beat = _beat("a", 100, 1).model_copy(update={"cordoned": True})
    view = fleet_view([beat, _beat("b", 100, 0)], now=101)
    assert [n["cordoned"] for n in view["nodes"]] == [True, False]
