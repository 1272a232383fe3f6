"""Which nodes are alive: each node's heartbeat in the nodes KV bucket, read by the API.

A paused sandbox belongs to the node that paused it (its capture is on that disk). When that
node is gone, the capture in the snapshot repository is the sandbox, and any node can resume
it: the API needs to tell "gone" from "busy", and a heartbeat that stopped is how.
"""

from __future__ import annotations

import json
import time

from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["MISSED_BEATS", "Heartbeat", "NodeBook", "is_gone"]

#: Beats a node may miss before it counts as gone (one late beat is a busy host).
MISSED_BEATS = 3


class Heartbeat(BaseModel):
    """What a node writes under its id every `every_s` seconds."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    node_id: str
    at: float
    every_s: float = 5.0
    capacity: int = 0
    free: int = 0


def is_gone(beat: Heartbeat | None, now: float) -> bool:
    """No heartbeat at all (expired from the bucket), or none for `MISSED_BEATS` periods."""
    return beat is None or now - beat.at > MISSED_BEATS * beat.every_s


class NodeBook:
    def __init__(self, js: JetStreamContext, bucket: str) -> None:
        self._js = js
        self._bucket = bucket

    async def heartbeat(self, node_id: str) -> Heartbeat | None:
        try:
            kv = await self._js.key_value(self._bucket)
            entry = await kv.get(node_id)
        except (KeyNotFoundError, BucketNotFoundError):
            return None
        try:
            return Heartbeat.model_validate(json.loads(entry.value or b"{}"))
        except (ValueError, ValidationError):
            return None

    async def gone(self, node_id: str) -> bool:
        return is_gone(await self.heartbeat(node_id), time.time())
