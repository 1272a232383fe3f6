"""The fleet as `aenv status` shows it: every node that beats (or stopped beating), its
room, accelerator and sandboxes, from the nodes bucket — what placement itself reads. Works
on any machine that reaches NATS (`stack.json`'s, or `AENV_NATS_URL`'s on a fleet)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the server's packages load only when the command runs
    from bus.nodes import Heartbeat

__all__ = ["fleet_view", "read_beats"]


def fleet_view(beats: Iterable[Heartbeat], now: float) -> dict[str, Any]:
    """Nodes (sorted by id) with their room and sandboxes; totals; placement skew — the
    most running sandboxes on one live node over the mean (1.0: evenly spread)."""
    from bus.nodes import is_gone

    nodes: list[dict[str, Any]] = []
    listed = sorted(beats, key=lambda b: b.node_id)
    for b in listed:
        nodes.append({
            "node": b.node_id, "state": "gone" if is_gone(b, now) else "beating",
            "last_beat_s": round(now - b.at, 1), "accelerator": b.accelerator,
            "running": b.running, "paused": b.paused,
            "room": {"vcpus": b.vcpus, "free_vcpus": b.free_vcpus, "mem_mib": b.mem_mib,
                     "free_mem_mib": b.free_mem_mib, "sandboxes": b.capacity,
                     "free_sandboxes": b.free},
            "uploads_waiting": b.uploads_waiting,
            "warm": {"ready": b.warm, "hits": b.warm_hits, "misses": b.warm_misses,
                     "mem_mib": b.warm_mem_mib},
        })  # fmt: skip
    live = [b for b in listed if not is_gone(b, now)]
    running = [b.running for b in live]
    mean = sum(running) / len(running) if running else 0.0
    return {
        "nodes": nodes,
        "beating": len(live),
        "gone": len(nodes) - len(live),
        "running": sum(running),
        "paused": sum(b.paused for b in live),
        "placement_skew": round(max(running) / mean, 2) if mean else None,
    }


async def read_beats(nats_url: str) -> list[Heartbeat]:
    """Every heartbeat in the nodes bucket now."""
    from bus import Bus, BusSettings
    from bus.nodes import NodeBook

    bus = await Bus.connect(BusSettings(nats_url=nats_url), setup=False, retry=False)
    try:
        book = await NodeBook.open(bus.js, bus.names.nodes_bucket)
        out: list[Heartbeat] = []
        for key in await _keys(book):
            beat = await book.heartbeat(key)
            if beat is not None:
                out.append(beat)
        return out
    finally:
        await bus.close()


async def _keys(book: Any) -> list[str]:
    from nats.js.errors import NoKeysError

    try:
        return list(await book.kv.keys())
    except NoKeysError:
        return []
