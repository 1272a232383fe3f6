"""Which nodes are alive: each node's heartbeat in the nodes KV bucket, read by the API.

A paused sandbox belongs to the node that paused it (its capture is on that disk). When that
node is gone, the capture in the snapshot repository is the sandbox, and any node can resume
it: the API needs to tell "gone" from "busy", and a heartbeat that stopped is how.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bus.kvwatch import kv_entries
from bus.supervised import supervise
from bus.tasks import cancel_and_wait

log = logging.getLogger(__name__)

__all__ = [
    "MISSED_BEATS",
    "Heartbeat",
    "NodeBook",
    "describe_uploads",
    "fleet_view",
    "has_room",
    "is_gone",
    "takes_new",
]

#: Beats a node may miss before it counts as gone (one late beat is a busy host).
MISSED_BEATS = 3


class Heartbeat(BaseModel):
    """What a node writes under its id every `every_s` seconds (and what readers get back:
    one schema for both sides)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    node_id: str
    at: float
    every_s: float = 5.0
    #: sandboxes it holds at most, and how many more it takes now
    capacity: int = 0
    free: int = 0
    running: int = 0
    paused: int = 0
    #: its budget after overcommit, and what is left of it (None: a node from before
    #: capacity-aware placement, whose room is unknown)
    vcpus: int | None = None
    mem_mib: int | None = None
    free_vcpus: int | None = None
    free_mem_mib: int | None = None
    #: host:port of the node's proxy (sandbox traffic, and what it observed of its guests:
    #: their metrics and logs, which the API asks it for)
    proxy: str | None = None
    accelerator: str | None = None
    accelerator_reason: str | None = None
    qemu: str | None = None
    #: Captures whose upload to the snapshot repository failed and waits for a retry, and
    #: how long the oldest has waited: a pause not yet durable (S3 down) made visible.
    uploads_waiting: int = 0
    oldest_upload_wait_s: float = 0.0
    #: Its warm pool: VMs ready per template (a create of one of those is a hand-over,
    #: not a restore), creates served by it and missed since the node started, and the
    #: memory (MiB) those VMs hold — room its sandboxes get back first when they need it.
    warm: dict[str, int] = Field(default_factory=dict)
    warm_hits: int = 0
    warm_misses: int = 0
    warm_mem_mib: int = 0
    #: Templates whose capture is on its disk: a create of one restores there without a
    #: fetch from the snapshot repository (placement prefers them: `held_on`).
    templates: tuple[str, ...] = ()
    #: Bytes its data dirs (state and image cache) allocate, per its last disk walk
    #: (`workers/node/disk`); None: a node from before disk accounting, or before its
    #: first walk ended.
    disk_used: int | None = None
    #: Bytes the node may keep on disk (its one budget, `disk.DiskBudget`), and the room it
    #: has for more: free under the budget plus what it could evict. None: a node from
    #: before the budget, or before its first walk ended.
    disk_budget: int | None = None
    disk_room: int | None = None
    #: Bytes it cannot evict now (what running and warm VMs and captures stand on).
    disk_pinned: int | None = None
    #: An operator cordoned it (`domain/node`): it takes no new sandboxes — the API places
    #: none there, and this beat is how it knows the node itself stopped pulling them.
    cordoned: bool = False


def describe_uploads(waiting: int, oldest_s: float) -> str:
    """How a failed-upload backlog reads in logs, readiness and `aenv status`."""
    plural = "s" if waiting != 1 else ""
    return f"{waiting} capture{plural} waiting for upload, oldest {oldest_s:.0f} s"


def has_room(beat: Heartbeat, vcpus: int, mem_mib: int, count: int = 1) -> bool:
    """Whether the node said it takes `count` more sandboxes, `vcpus` and `mem_mib` in all
    (a node that does not say what is left counts as having room: it decides itself when
    it pulls)."""
    if beat.free < count:
        return False
    if beat.free_vcpus is None or beat.free_mem_mib is None:
        return True
    return beat.free_vcpus >= vcpus and beat.free_mem_mib >= mem_mib


def takes_new(beat: Heartbeat, now: float) -> bool:
    """Whether new sandboxes may go to the node: it beats and is not cordoned."""
    return not is_gone(beat, now) and not beat.cordoned


def is_gone(beat: Heartbeat | None, now: float) -> bool:
    """No heartbeat at all (expired from the bucket), or none for `MISSED_BEATS` periods."""
    return beat is None or now - beat.at > MISSED_BEATS * beat.every_s


def fleet_view(beats: Iterable[Heartbeat], now: float) -> dict[str, Any]:
    """The fleet as `aenv status` and the web console show it: nodes (sorted by id) with
    their room, warm pool and sandboxes; totals; placement skew — the most running
    sandboxes on one live node over the mean (1.0: evenly spread)."""
    nodes: list[dict[str, Any]] = []
    listed = sorted(beats, key=lambda b: b.node_id)
    for b in listed:
        nodes.append(
            {
                "node": b.node_id,
                "state": "gone" if is_gone(b, now) else "beating",
                "cordoned": b.cordoned,  # takes no new sandboxes (`aenv node cordon`)
                "last_beat_s": round(now - b.at, 1),
                "accelerator": b.accelerator,
                "running": b.running,
                "paused": b.paused,
                "room": {
                    "vcpus": b.vcpus,
                    "free_vcpus": b.free_vcpus,
                    "mem_mib": b.mem_mib,
                    "free_mem_mib": b.free_mem_mib,
                    "sandboxes": b.capacity,
                    "free_sandboxes": b.free,
                },
                "uploads_waiting": b.uploads_waiting,
                "disk": {  # bytes (None: a node from before disk accounting)
                    "used": b.disk_used,
                    "budget": b.disk_budget,
                    "room": b.disk_room,
                    "pinned": b.disk_pinned,
                },
                "warm": {
                    "ready": b.warm,
                    "hits": b.warm_hits,
                    "misses": b.warm_misses,
                    "mem_mib": b.warm_mem_mib,
                },
            }
        )
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


class NodeBook:
    """Typed access to the nodes bucket, opened once (opening it is a round trip).

    `follow()` keeps a mirror of every node's latest beat from a watch of the bucket: the
    API asks "is this node gone?" on every resume, and the mirror answers without a round
    trip. A node the mirror has not heard of yet (or before the watch delivered the bucket's
    current values) is read from the bucket."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.beats: dict[str, Heartbeat] = {}
        self._synced = False
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, js: JetStreamContext, bucket: str) -> NodeBook:
        return cls(await js.key_value(bucket))

    def follow(self) -> None:
        if self._task is None:
            # a dead mirror would show every node gone (or none): restarted (`supervised`)
            self._task = supervise("node-book", self._follow)

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _follow(self) -> None:
        while True:
            try:
                async with contextlib.aclosing(kv_entries(self.kv, _decode)) as entries:
                    async for item in entries:
                        if item is None:  # the bucket's current values are all in
                            self._synced = True
                            continue
                        node_id, beat = item
                        if beat is None:
                            self.beats.pop(node_id, None)
                        else:
                            self.beats[node_id] = beat
            except asyncio.CancelledError:
                raise
            except Exception as e:  # NATS restarting: read the bucket meanwhile, then rewatch
                self._synced = False
                log.warning("nodes watch lost (%s); watching again", e)
                await asyncio.sleep(1.0)

    def current(self) -> dict[str, Heartbeat] | None:
        """Every node's latest beat, from the mirror; None until the mirror holds the
        bucket's values (`follow()` not called, or its watch still filling)."""
        return dict(self.beats) if self._synced else None

    async def all(self) -> list[Heartbeat]:
        """Every node's latest beat: the mirror's, else read from the bucket."""
        mirrored = self.current()
        if mirrored is not None:
            return list(mirrored.values())
        try:
            keys = list(await self.kv.keys())
        except NoKeysError:
            return []
        beats = [await self.heartbeat(key) for key in keys]
        return [b for b in beats if b is not None]

    async def beat(self, heartbeat: Heartbeat) -> None:
        await self.kv.put(heartbeat.node_id, heartbeat.model_dump_json().encode())

    async def heartbeat(self, node_id: str) -> Heartbeat | None:
        if self._synced and node_id in self.beats:
            return self.beats[node_id]
        try:
            entry = await self.kv.get(node_id)
        except KeyNotFoundError:
            return None
        return _decode(entry.value)

    async def gone(self, node_id: str) -> bool:
        return is_gone(await self.heartbeat(node_id), time.time())


def _decode(raw: bytes | None) -> Heartbeat | None:
    try:
        return Heartbeat.model_validate_json(raw or b"{}")
    except ValidationError:
        return None
