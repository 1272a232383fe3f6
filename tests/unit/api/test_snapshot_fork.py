"""A snapshot's fork decided with no services (`api/spread.py`, `api/snapfork.py`): the
count's bounds, each node's room for the children, the node each child is asked of, a
fleet short of room refused before any child is sent, and the children's creates (ids
from the fork's id, fresh tokens, the fork in their metadata, copy-on-write); a node
passes on a child its fork spread elsewhere, once."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

import pytest

from api.auth import Caller
from api.context import ApiSettings
from api.errors import ApiError
from api.snapfork import FORK_KEY, child_creates
from api.spread import (
    check_count,
    check_fleet_room,
    check_within_limit,
    room_for,
    rooms,
    spread,
)
from bus.nodes import Heartbeat
from domain import sandbox as sb

CALLER = Caller(key_id="key1", team_id="team1")
TPL: dict[str, Any] = {
    "template_id": "rl-ready",
    "alias": None,
    "cpu_count": 1,
    "memory_mb": 512,
    "disk_size_mb": 2048,
    "envd_version": "0.6.13",
}


def _beat(
    node: str,
    *,
    free: int = 32,
    free_vcpus: int | None = 32,
    free_mem: int | None = 8192,
    cordoned: bool = False,
    at: float = 0,
) -> Heartbeat:
    return Heartbeat(
        node_id=node,
        at=at or time.time(),
        capacity=32,
        free=free,
        vcpus=32,
        mem_mib=8192,
        free_vcpus=free_vcpus,
        free_mem_mib=free_mem,
        cordoned=cordoned,
    )


@pytest.mark.parametrize(("count", "ok"), [(0, False), (-3, False), (1, True), (100, True)])
def test_a_count_is_bounded_with_e2b_words(count: int, ok: bool) -> None:
    if ok:
        check_count(count, 100)
        return
    with pytest.raises(ApiError) as e:
        check_count(count, 100)
    assert e.value.status == 400 and "at least 1" in e.value.message


def test_a_count_past_the_setting_is_a_400_naming_it() -> None:
    with pytest.raises(ApiError) as e:
        check_count(101, 100)
    assert e.value.status == 400 and "greater than 100" in e.value.message


def test_a_count_past_the_callers_running_limit_is_a_400_not_a_429() -> None:
    check_within_limit(10, 0, "AENV_TEAM_MAX_SANDBOXES")  # no limit
    check_within_limit(10, 10, "team t")  # all of it, with nothing else running: 429 if not
    with pytest.raises(ApiError) as e:
        check_within_limit(11, 10, "team t")
    assert e.value.status == 400 and "(10, team t)" in e.value.message


def test_room_is_the_scarcest_of_slots_vcpus_and_memory() -> None:
    assert room_for(_beat("a", free=32, free_vcpus=32, free_mem=8192), 1, 512) == 16  # memory
    assert room_for(_beat("a", free=3), 1, 512) == 3  # slots
    assert room_for(_beat("a", free_vcpus=4), 2, 512) == 2  # vCPUs
    assert room_for(_beat("a", free_vcpus=None, free_mem=None, free=5), 2, 512) == 5
    assert room_for(_beat("a", free=0), 1, 512) == 0


def test_only_nodes_that_take_new_sandboxes_have_room() -> None:
    now = time.time()
    beats = [_beat("a"), _beat("b", cordoned=True), _beat("c", at=now - 3600)]
    assert rooms(beats, 1, 512, now) == {"a": 16}


def test_children_are_spread_evenly_over_equal_nodes() -> None:
    asked = spread(24, {"n1": 30, "n2": 30})
    assert Counter(asked) == {"n1": 12, "n2": 12}
    assert asked[:4] == ["n1", "n2", "n1", "n2"]  # alternating: a partial burst is even too


def test_children_go_where_the_room_is() -> None:
    # the node with the most room left takes the next: the fleet's free room evens out
    assert Counter(spread(6, {"big": 10, "small": 2})) == {"big": 6}
    assert Counter(spread(12, {"big": 10, "small": 2})) == {"big": 10, "small": 2}
    assert Counter(spread(4, {"full": 0, "free": 8})) == {"free": 4}  # a full node: none
    assert spread(3, {}) == []  # no heartbeats heard: no hints, placement decides


def test_past_the_fleets_room_the_rest_go_round_every_node() -> None:
    assert Counter(spread(5, {"a": 1, "b": 1})) == {"a": 3, "b": 2}


def test_a_fleet_short_of_room_is_a_503_before_any_child_is_sent() -> None:
    check_fleet_room(24, {"a": 12, "b": 12}, 1, 512)
    check_fleet_room(24, {}, 1, 512)  # not heard yet: placement decides
    with pytest.raises(ApiError) as e:
        check_fleet_room(25, {"a": 12, "b": 12}, 1, 512)
    assert e.value.status == 503 and e.value.headers.get("Retry-After")
    assert "room for 24" in e.value.message and "2 nodes" in e.value.message


def test_children_are_creates_of_the_snapshot_named_by_the_fork() -> None:
    fork = uuid.UUID(int=42)
    kids = child_creates(
        TPL,
        CALLER,
        ApiSettings(default_on_timeout="kill"),
        fork_id=fork,
        count=3,
        timeout=600,
        metadata={"run": "r1"},
    )
    assert [k.sandbox_id for k in kids] == list(sb.fork_child_ids(fork, 3))
    assert len({k.command_id for k in kids}) == 3
    for k in kids:
        assert k.template_id == "rl-ready" and k.team_id == "team1"
        assert k.timeout_s == 600 and k.copy_on_write
        assert k.metadata == {"run": "r1", FORK_KEY: str(fork)}
        assert k.lifecycle.on_timeout == "kill"
    assert len({k.envd_access_token for k in kids}) == 3  # each child its own token
    again = child_creates(
        TPL, CALLER, ApiSettings(), fork_id=fork, count=3, timeout=600, metadata={}
    )
    assert [k.command_id for k in again] == [k.command_id for k in kids]  # a retry: the same


def test_the_hints_are_not_part_of_the_spec() -> None:
    """`prefer_on` and `copy_on_write` travel with the command, never into the log's
    `SandboxRequested` (a hint about this one placement, as `warm_on` is)."""
    kid = child_creates(
        TPL, CALLER, ApiSettings(), fork_id=uuid.uuid4(), count=1, timeout=60, metadata={}
    )[0].model_copy(update={"prefer_on": ("n2",)})
    (event,) = sb.decide(None, kid)
    assert isinstance(event, sb.SandboxRequested)
    dumped = event.model_dump()
    assert "prefer_on" not in str(dumped) and "copy_on_write" not in str(dumped)


def test_a_node_passes_on_a_child_spread_elsewhere_once() -> None:
    from workers.node.warmsize import passes_on

    assert passes_on(("n2",), "n1", 0)  # asked of n2: n1 passes it on
    assert not passes_on(("n1",), "n1", 0)  # its own
    assert not passes_on((), "n1", 0)  # no hint: whoever pulls


def test_a_child_claimed_by_a_node_that_is_lost_fails_with_an_event() -> None:
    """A node that dies mid-fork leaves none of its children `creating`: the child's
    request names the node that claimed it, and the fleet timer's lost-node rule decides
    its failure (`SandboxFailed`) — as for any create on that node."""
    kid = child_creates(
        TPL, CALLER, ApiSettings(), fork_id=uuid.uuid4(), count=1, timeout=60, metadata={}
    )[0].model_copy(update={"node_id": "n2", "prefer_on": ("n2",)})
    state = sb.fold(sb.decide(None, kid), None)
    assert isinstance(state, sb.Sandbox) and state.status is sb.SandboxStatus.CREATING
    clock = sb.clock_of(state)
    assert clock is not None and clock.node_id == "n2"
    (done,) = sb.orphan_commands(clock, "node n2 is gone")
    events = sb.decide(state, done)
    assert [type(e) for e in events] == [sb.SandboxFailed]
    after = sb.fold(events, state)
    assert isinstance(after, sb.Sandbox) and after.status is sb.SandboxStatus.FAILED
