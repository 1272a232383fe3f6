"""Retries with exponential backoff and jitter, for `RetryableStoreError` only.

The store adapters decide what is transient (a 503, a reset connection); this module only
decides how long to wait. Jitter keeps many nodes that failed together from retrying in
lockstep against a recovering S3.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from workers.snapshot.errors import RetryableStoreError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` tries in all; waits base*2^n (capped at `max_delay`), +-50% jitter."""

    attempts: int = 6
    base_delay: float = 0.2
    max_delay: float = 5.0

    def delay(self, failures: int) -> float:
        """Seconds to wait after the `failures`-th consecutive failure (1-based), pre-jitter."""
        return float(min(self.max_delay, self.base_delay * 2 ** (failures - 1)))


async def retrying(op: Callable[[], Awaitable[T]], policy: RetryPolicy) -> T:
    """Await `op()` until it succeeds, raises a non-retryable error, or attempts run out."""
    failures = 0
    while True:
        try:
            return await op()
        except RetryableStoreError:
            failures += 1
            if failures >= policy.attempts:
                raise
            await asyncio.sleep(policy.delay(failures) * random.uniform(0.5, 1.5))
