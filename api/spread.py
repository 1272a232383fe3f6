"""How the children of one snapshot fork are spread over the fleet, decided without I/O.

Placement stays pull-based (design §9): every child is a create on the placement queue,
taken by whichever node pulls it while it has room. What the API adds is a hint per
child (`CreateSandbox.prefer_on`), from the room each node's heartbeat reported: the
children go round the nodes with the most room left, so a fork of 24 on two empty nodes
asks each for 12 — and a node that was not asked passes a child on once, then takes it
if it comes back (the asked node was slow, full or gone). Without the hint the node that
pulls fastest takes most of a burst, and one node would fetch, hold and run what two
could share.

Also here: the bounds of a fork's count (E2B's 400 body) and the fleet's room for all its
children at once (a 503 with Retry-After before any child is sent, never half a fork
refused child by child).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable, Mapping

from api.errors import ApiError
from bus.nodes import Heartbeat, takes_new

__all__ = [
    "check_count",
    "check_fleet_room",
    "check_within_limit",
    "room_for",
    "rooms",
    "spread",
]


def check_count(count: int, most: int) -> None:
    """400 (E2B's body, its words) for a count outside 1..`most`."""
    if count < 1:
        raise ApiError(400, f"Count must be at least 1, got {count}")
    if count > most:
        raise ApiError(400, f"Count cannot be greater than {most}, got {count}")


def check_within_limit(count: int, max_sandboxes: int, source: str) -> None:
    """400 (E2B's words) for a fork larger than the caller may ever run at once: a 429 would
    tell it to retry what can never be admitted. `max_sandboxes` 0: no limit."""
    if max_sandboxes and count > max_sandboxes:
        raise ApiError(
            400,
            f"Count must not exceed the maximum number of concurrent sandboxes "
            f"({max_sandboxes}, {source})",
        )


def room_for(beat: Heartbeat, vcpus: int, mem_mib: int) -> int:
    """How many more sandboxes of `vcpus` / `mem_mib` the node said it takes (a node that
    does not report vCPUs or memory: its free slots alone)."""
    n = beat.free
    if beat.free_vcpus is not None and vcpus > 0:
        n = min(n, beat.free_vcpus // vcpus)
    if beat.free_mem_mib is not None and mem_mib > 0:
        n = min(n, beat.free_mem_mib // mem_mib)
    return max(n, 0)


def rooms(
    beats: Iterable[Heartbeat], vcpus: int, mem_mib: int, now: float | None = None
) -> dict[str, int]:
    """Room per node that takes new sandboxes now (beating, not cordoned), by node id."""
    at = time.time() if now is None else now
    return {b.node_id: room_for(b, vcpus, mem_mib) for b in beats if takes_new(b, at)}


def spread(count: int, room: Mapping[str, int]) -> list[str]:
    """The node each of `count` children is asked of: always the node with the most room
    left (ties: the node id), so the fleet fills evenly. Nodes without room are asked
    nothing; past the fleet's room the rest go round every node (they wait in the queue
    for the first that frees room). Empty when no node is known."""
    if not room:
        return []
    heap = [(-left, node) for node, left in room.items() if left > 0]
    heapq.heapify(heap)
    out: list[str] = []
    while heap and len(out) < count:
        left, node = heapq.heappop(heap)
        out.append(node)
        if left + 1 < 0:
            heapq.heappush(heap, (left + 1, node))
    nodes = sorted(room)
    out.extend(nodes[i % len(nodes)] for i in range(count - len(out)))
    return out


def check_fleet_room(count: int, room: Mapping[str, int], vcpus: int, mem_mib: int) -> None:
    """503 with Retry-After when the nodes that take new sandboxes have room for fewer
    than `count` of this size in all (quiet when no node is known: the API has not heard
    the heartbeats yet, and placement decides)."""
    if not room:
        return
    total = sum(room.values())
    if total >= count:
        return
    raise ApiError(
        503,
        f"no room for {count} sandboxes of {vcpus} vCPU / {mem_mib} MiB: the "
        f"{len(room)} node{'s' if len(room) != 1 else ''} taking new sandboxes have room "
        f"for {total}",
        headers={"Retry-After": "5"},
    )
