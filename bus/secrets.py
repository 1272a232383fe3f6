"""Short-lived secrets handed from the API to a worker, beside the log, never in it.

A template build from a private registry needs the registry password on the node that
pulls; the event log keeps everything forever and `aenv events` prints it. So the API puts
the credentials here (a memory-only KV bucket with a TTL) under a key the build's events
may name, and the node reads them when it pulls.
"""

from __future__ import annotations

import json
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

__all__ = ["SecretBox"]


class SecretBox:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext, bucket: str) -> SecretBox:
        return cls(await js.key_value(bucket))

    async def put(self, key: str, value: dict[str, Any]) -> None:
        await self.kv.put(key, json.dumps(value).encode())

    async def get(self, key: str) -> dict[str, Any] | None:
        """The secret, or None when it expired (its TTL) or never was."""
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None
        doc = json.loads(entry.value)
        return doc if isinstance(doc, dict) else None
