"""Which nodes are alive: each node's heartbeat in the nodes KV bucket, read by the API.

A paused sandbox belongs to the node that paused it (its capture is on that disk). When that
node is gone, the capture in the snapshot repository is the sandbox, and any node can resume
it: the API needs to tell "gone" from "busy", and a heartbeat that stopped is how.
"""

from __future__ import annotations

import time

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["MISSED_BEATS", "Heartbeat", "NodeBook", "is_gone"]

#: Beats a node may miss before it counts as gone (one late beat is a busy host).
MISSED_BEATS = 3


class Heartbeat(BaseModel):
    """What a node writes under its id every `every_s` seconds (and what readers get back:
    one schema for both sides)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    node_id: str
    at: float
    every_s: float = 5.0
    capacity: int = 0
    free: int = 0
    running: int = 0
    accelerator: str | None = None
    accelerator_reason: str | None = None
    qemu: str | None = None


def is_gone(beat: Heartbeat | None, now: float) -> bool:
    """No heartbeat at all (expired from the bucket), or none for `MISSED_BEATS` periods."""
    return beat is None or now - beat.at > MISSED_BEATS * beat.every_s


class NodeBook:
    """Typed access to the nodes bucket, opened once (opening it is a round trip)."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext, bucket: str) -> NodeBook:
        return cls(await js.key_value(bucket))

    async def beat(self, heartbeat: Heartbeat) -> None:
        await self.kv.put(heartbeat.node_id, heartbeat.model_dump_json().encode())

    async def heartbeat(self, node_id: str) -> Heartbeat | None:
        try:
            entry = await self.kv.get(node_id)
        except KeyNotFoundError:
            return None
        try:
            return Heartbeat.model_validate_json(entry.value or b"{}")
        except ValidationError:
            return None

    async def gone(self, node_id: str) -> bool:
        return is_gone(await self.heartbeat(node_id), time.time())
