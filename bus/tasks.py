"""Stopping a background task for sure.

Python 3.11's `asyncio.wait_for` can swallow a cancellation that arrives in the same loop
turn as the result it waits for (gh-86296; fixed in 3.12), and nats-py waits on every
request that way. A task cancelled right then goes on: a KV watch that was just being set
up then waits for its next update forever — and so does whoever awaited the cancelled
task (seen: a route table closed right after it opened kept a test's teardown waiting
until the 300 s timeout; a stack's shutdown would wait as long). So: cancel again until
the task is done.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(task: asyncio.Task[Any] | None, *, retry_s: float = 0.1) -> None:
    """Cancel `task` and return once it has ended (its outcome is discarded)."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=retry_s)
    if not task.cancelled():
        task.exception()  # retrieved: an error it ended with is not "never retrieved"
