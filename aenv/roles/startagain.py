"""A role's start tried again when the bus does not answer in time before the role is ready.

Under load (two CPU hogs beside the fleet test, seen once in five runs) a JetStream request
of an API's start — a consumer made, a key bucket opened — outlasted its timeout and the
role exited (code 3) before it ever served. Under `aenv up` its supervisor starts it again;
in a rig, under a bare `aenv serve` or a unit's slow restart, that is a role lost or a
whole start repeated for one slow answer. Each start undoes what it did on its way out
(its exit stack), so the same start runs again, twice at most, a little later. Only
before READY: a role that served and then meets an error stops as it always did.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import ServiceUnavailableError

from aenv.roles.common import said_ready

__all__ = ["START_TRIES", "TRANSIENT", "start_again"]

log = logging.getLogger(__name__)

#: what a slow or briefly leaderless JetStream answers a request with
TRANSIENT = (NatsTimeout, NoRespondersError, ServiceUnavailableError, TimeoutError)
START_TRIES = 3


async def start_again(
    start: Callable[[], Awaitable[None]], stop: asyncio.Event, pause_s: float = 2.0
) -> None:
    """Run `start` (a role: it returns when the role has stopped), again after a transient
    bus error that came before READY, `START_TRIES` times in all."""
    for attempt in range(1, START_TRIES + 1):
        try:
            await start()
            return
        except TRANSIENT as e:
            if said_ready() or stop.is_set() or attempt == START_TRIES:
                raise
            log.warning(
                "start %d of %d cut short by the bus (%r): starting again in %.0f s",
                attempt,
                START_TRIES,
                e,
                pause_s * attempt,
            )
            await asyncio.sleep(pause_s * attempt)
