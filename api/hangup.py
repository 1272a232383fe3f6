"""A client that hangs up on a create never learns the sandbox's id, so nobody would ever
use or kill it: it would run (and hold a node's room) for its whole TTL. The create's
handler watches for the hang-up while the VM starts and, when it comes, kills what it made
— unless the client sent an idempotency key, with which a retry claims the same sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request

__all__ = ["watch_hangup"]


async def _hangup(request: Request[Any, Any, Any]) -> None:
    """Returns when the client disconnects. Called once the body is read: the only message
    still to come on this request is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@contextlib.asynccontextmanager
async def watch_hangup(request: Request[Any, Any, Any]) -> AsyncIterator[asyncio.Task[None]]:
    """A task that is done once the client hung up; cancelled on leaving."""
    task = asyncio.create_task(_hangup(request))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
