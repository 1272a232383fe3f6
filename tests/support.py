"""Small helpers shared by every test tier: polling instead of sleeping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]], *, timeout: float = 10.0, interval: float = 0.05
) -> T:
    """Await `probe` until it returns a truthy value or stops raising, or fail after `timeout`.

    Tests poll real systems (a VM booting, a projection catching up); a fixed sleep is
    either flaky or slow, this is neither.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = await probe()
            if value:
                return value
            last = None
        except Exception as e:  # the probe's failure is the information we report
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last error: {last!r})")
        await asyncio.sleep(interval)


def eventually_sync(
    probe: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.05
) -> T:
    """Synchronous twin of `eventually` for tests that drive blocking clients (the e2b SDK)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
            last = None
        except Exception as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last error: {last!r})")
        time.sleep(interval)
