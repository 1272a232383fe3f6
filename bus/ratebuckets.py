"""Fleet-wide token buckets in a NATS KV bucket: the creates-per-second limit of a team
holds across every API replica (issue 32).

Each bucket is one KV entry holding GCRA's one number (`domain.limits.take_tokens`): its
theoretical arrival time, wall-clock seconds. Taking tokens reads the entry and writes the
new value with compare-and-set on the revision it read (JetStream's `last` sequence), so
two replicas racing for the last token cannot both get it: the loser reads again. The
cost per create is one KV update (a compare-and-set over the revision this API wrote last; a
get first only when another replica moved it, or to refuse); the entry of an idle bucket
expires with the KV bucket's TTL (a bucket idle that long is full anyway).

The replicas' clocks are the buckets' clock: skew between them shifts a refill by as
much, which NTP keeps to milliseconds against a rate's interval of tens of milliseconds.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import time

from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from domain.limits import RateDecision, take_tokens

__all__ = ["CONTENDED", "RateBuckets"]

#: Compare-and-set rounds before a take gives up (each loss means another replica took
#: tokens of the same bucket in the same millisecond; ten in a row is a storm).
_ROUNDS = 10
#: What a take lost to ten racers in a row answers: refused, retry in a second.
CONTENDED = RateDecision(False, 0.0, 1.0)


class RateBuckets:
    """The token buckets in one KV bucket (`bus.subjects.Names.admission_bucket`)."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        #: Compare-and-set rounds lost to another taker since this was made.
        self.lost = 0
        # one take at a time per bucket in this process: its own requests would otherwise
        # lose rounds to each other (16 creates in flight lost 10 in a row: refused as
        # contended at a rate no one reached), leaving the compare-and-set to the replicas
        self._locks: dict[str, asyncio.Lock] = {}
        self._last: dict[str, tuple[float | None, int | None]] = {}  # key → (TAT, revision)

    @staticmethod
    def key(bucket: str) -> str:
        """The KV key of a bucket name (team ids may hold characters keys may not)."""
        return "b." + base64.urlsafe_b64encode(bucket.encode()).decode().rstrip("=")

    async def take(
        self, bucket: str, now: float | None = None, *, rate: float, burst: int, n: int = 1
    ) -> RateDecision:
        """Take `n` tokens from `bucket` (refilled at `rate`/s, holding `burst`) if it has
        them, for every replica at once; `now` (wall-clock seconds) is read once this
        process's turn on the bucket has come, unless given."""
        async with self._locks.setdefault(bucket, asyncio.Lock()):
            at = time.time() if now is None else now
            return await self._take(self.key(bucket), at, rate=rate, burst=burst, n=n)

    async def _take(self, key: str, now: float, *, rate: float, burst: int, n: int) -> RateDecision:
        # What this process last wrote: tried first, so a bucket only this API takes from
        # costs one round trip (the compare-and-set), not a get before it. A write over a
        # revision someone else moved fails and reads; a refusal reads the bucket first
        # (an entry expired or replaced since may have room).
        last = self._last.get(key)
        for _ in range(_ROUNDS):
            cached = last is not None
            tat, revision = last if last is not None else await self._read(key)
            decision = take_tokens(tat, now, rate=rate, burst=burst, n=n)
            if not decision.allowed:
                if cached:
                    last = None
                    continue
                self._last[key] = (tat, revision)
                return decision
            value = struct.pack("!d", decision.tat)
            try:
                if revision is None:
                    written = await self.kv.create(key, value)
                else:
                    written = await self.kv.update(key, value, last=revision)
            except KeyWrongLastSequenceError:
                self.lost += 1  # another replica took tokens meanwhile: read again
                last = None
                continue
            self._last[key] = (decision.tat, written)
            return decision
        self._last.pop(key, None)
        return CONTENDED

    async def _read(self, key: str) -> tuple[float | None, int | None]:
        try:
            entry = await self.kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return None, None
        if not entry.value or len(entry.value) != 8:
            # a purged or foreign value: start the bucket full, over the same revision
            return None, entry.revision
        (tat,) = struct.unpack("!d", entry.value)
        return tat, entry.revision
