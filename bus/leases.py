"""Fleet-wide leases in a NATS KV bucket: whoever creates the key first holds it until
the bucket's TTL removes it.

For periodic work one node of a fleet should do at a time (the repository GC): every node
tries `acquire` each period; JetStream's create is a compare-and-set on "no such key", so
exactly one of any number of racers wins, and the TTL frees the lease even when its holder
dies. NATS before 2.11 has no per-message TTL, so the TTL is the bucket's: one bucket per
kind of lease, made by its first user with that lease's period.
"""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue

__all__ = ["Lease"]


class Lease:
    """One named lease; held by whoever created `key` within the last `ttl_s` seconds."""

    def __init__(self, kv: KeyValue, key: str) -> None:
        self.kv = kv
        self.key = key

    @classmethod
    async def open(
        cls, js: JetStreamContext, bucket: str, key: str, *, ttl_s: float, replicas: int = 1
    ) -> Lease:
        """The lease `key` in `bucket`, made with `ttl_s` if it does not exist yet (a
        bucket made by a node with another period keeps its own: the first one wins)."""
        try:
            kv = await js.key_value(bucket)
        except BucketNotFoundError:
            config = KeyValueConfig(
                bucket=bucket,
                description="fleet-wide leases: the holder's id, for the bucket's TTL",
                history=1,
                ttl=ttl_s,
                storage=StorageType.FILE,  # a restarted NATS must not free a held lease
                replicas=replicas,
            )
            try:
                kv = await js.create_key_value(config)  # (the same config twice is no error)
            except APIError:  # made meanwhile by a node with another period: use it
                kv = await js.key_value(bucket)
        return cls(kv, key)

    async def acquire(self, holder: str) -> bool:
        """Take the lease for `holder` if nobody holds it; whether we got it."""
        try:
            await self.kv.create(self.key, holder.encode())
        except KeyWrongLastSequenceError:
            return False
        return True

    async def holder(self) -> str | None:
        """Who holds it now (None: free)."""
        try:
            entry = await self.kv.get(self.key)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        return entry.value.decode() if entry.value else None
