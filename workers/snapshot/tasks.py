"""Running the transfer's concurrent parts together, failing as the first of them failed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["gather", "run_workers"]


async def run_workers(n: int, worker: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run `n` copies of `worker`; the first failure cancels the rest and is re-raised
    as itself (callers handle `StoreError`, not an ExceptionGroup)."""
    await gather(*(worker() for _ in range(n)))


async def gather(*coros: Coroutine[Any, Any, Any]) -> None:
    """Run `coros` together; the first failure cancels the rest and is re-raised as itself."""
    try:
        async with asyncio.TaskGroup() as tg:
            for c in coros:
                tg.create_task(c)
    except BaseExceptionGroup as eg:
        raise eg.exceptions[0] from None
