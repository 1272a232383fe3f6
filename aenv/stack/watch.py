"""Keep an embedded server running: restart it with backoff whenever it dies.

A server that died (OOM-killed, SIGKILLed, crashed) comes back on the same port and data
dir, so the roles' clients reconnect to it by themselves: nats-py retries for ever
(`bus.connection`), the SQLAlchemy pool pre-pings, boto opens new connections. Without
this the API answered 500/503 until someone ran `aenv down` and `aenv up`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from aenv.backoff import CAP_S, CrashRecord
from aenv.stack.process import ManagedProcess, StackError

#: How often to look: a dead server is noticed within this, restarted after the backoff.
POLL_S = 0.5


async def keep_running(
    process: ManagedProcess,
    start: Callable[[], Awaitable[object]],
    stop: asyncio.Event,
    say: Callable[[str], None],
    *,
    cap_s: float = CAP_S,
) -> None:
    """Until `stop`: whenever `process` is found dead, `start()` it again (which waits
    until it answers), its delay doubling while it keeps dying."""
    crashes = CrashRecord(cap_s=cap_s)
    crashes.started(time.monotonic())
    while not stop.is_set():
        if process.running():
            await _sleep_unless(stop, POLL_S)
            continue
        code = process.proc.returncode if process.proc is not None else None
        delay = crashes.crashed(time.monotonic())
        say(
            f"{process.name} exited unexpectedly (code {code}, {crashes.streak} in a row); "
            f"restarting it in {delay:.1f}s"
        )
        if await _sleep_unless(stop, delay):
            return
        crashes.started(time.monotonic())
        try:
            await start()
        except (StackError, OSError) as e:
            say(f"{process.name} did not come back: {str(e).strip().splitlines()[0]}")
            continue
        say(f"{process.name} is back")


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds`; True if `stop` was set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True
