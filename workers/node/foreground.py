"""Work a client waits for first; the node's housekeeping after it, at the lowest priority.

A restore is what a client is waiting on; refilling the RAM-copy and network-slot pools,
tearing down released slots and collecting layers are not. On a host of few cores they
used to start a fixed delay after a restore *began* — on a slow host that is right when
the restore ends, and the copy of ~150 MiB landed on the event, the HTTP answer and the
client's first command. Now the housekeeping waits until no restore is in flight and the
last one ended a moment ago, and runs in threads whose CPU and I/O priority is the
lowest, so work that starts meanwhile takes the CPU from it, not the other way round.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: After the last foreground operation ended, housekeeping waits this long for quiet (the
#: event, the answer and a client's next request follow a restore within milliseconds).
QUIET_S = 0.3
#: ...but never longer than this: a node under steady load still refills its pools.
MAX_WAIT_S = 3.0

_SYS_IOPRIO_SET = 251  # x86_64
_IOPRIO_WHO_PROCESS = 1
_IOPRIO_CLASS_IDLE = 3
_IOPRIO_CLASS_SHIFT = 13
_libc = ctypes.CDLL(None, use_errno=True)


class Foreground:
    """Counts the operations a client waits on and tells housekeeping when to go."""

    def __init__(self, quiet_s: float = QUIET_S, max_wait_s: float = MAX_WAIT_S) -> None:
        self.quiet_s = quiet_s
        self.max_wait_s = max_wait_s
        self._active = 0
        self._last_end = 0.0
        self._closing = False
        self._changed = asyncio.Event()

    def closing(self) -> None:
        """Shutting down: nothing waits for quiet any more."""
        self._closing = True
        self._changed.set()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        self._active += 1
        self._changed.set()
        try:
            yield
        finally:
            self._active -= 1
            self._last_end = time.monotonic()
            self._changed.set()

    def quiet_for(self, now: float) -> float:
        """Seconds still to wait before housekeeping may start (0: go)."""
        if self._closing:
            return 0.0
        if self._active:
            return self.quiet_s
        return max(0.0, self.quiet_s - (now - self._last_end))

    async def settled(self) -> None:
        """Return once nothing has been in the foreground for `quiet_s` (or after
        `max_wait_s` whatever happens)."""
        deadline = time.monotonic() + self.max_wait_s
        while (left := deadline - time.monotonic()) > 0:
            wait = self.quiet_for(time.monotonic())
            if wait <= 0:
                return
            self._changed.clear()
            if self._active:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(wait, left))
            else:
                await asyncio.sleep(min(wait, left))

    def pause_point(self) -> None:
        """For a housekeeping thread between two chunks of its work: block while anything
        is in the foreground (at most `max_wait_s`). A copy that began in a quiet moment
        thus stops for a restore or pause that starts meanwhile, instead of sharing the
        disk and the page cache with it."""
        deadline = time.monotonic() + self.max_wait_s
        while self._active and not self._closing and time.monotonic() < deadline:
            time.sleep(0.002)


@contextlib.contextmanager
def lowest_priority() -> Iterator[None]:
    """Run the calling thread (and any process it starts) at nice 19 and idle I/O class;
    restored on exit, so a pool thread goes back to normal work afterwards."""
    if os.geteuid() != 0:  # could not raise it back afterwards: leave it alone
        yield
        return
    tid = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, tid)
    try:
        os.setpriority(os.PRIO_PROCESS, tid, 19)
        _ioprio(tid, _IOPRIO_CLASS_IDLE << _IOPRIO_CLASS_SHIFT)
    except OSError as e:  # e.g. a seccomp filter: housekeeping runs at normal priority
        log.debug("cannot lower the priority of thread %d: %s", tid, e)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, before)
            _ioprio(tid, 0)  # "none": I/O priority follows the CPU nice value again


def _ioprio(tid: int, value: int) -> None:
    if _libc.syscall(_SYS_IOPRIO_SET, _IOPRIO_WHO_PROCESS, tid, value) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


async def in_background(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`asyncio.to_thread` at the lowest priority."""

    def run() -> T:
        with lowest_priority():
            return fn(*args, **kwargs)

    return await asyncio.to_thread(run)
