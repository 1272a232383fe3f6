"""Background tasks that cannot die silently: restarted in place, or the process goes down.

A node whose heartbeat task died kept running with every VM while the fleet took it for
gone, and the timer killed its sandboxes as lost; a consumer loop or the TTL timer that
died left a live process doing nothing. `supervise(name, run)` starts `run()` in a task
and watches it: when it raises — or is cancelled by anything but its owner's stop — the
death is logged at ERROR with the exception and `run()` starts again after a backoff,
counted in `restarts()` (`aenv_task_restarts_total{task}`, `shared.metrics`). A task
that keeps dying (`RestartPolicy.deaths` times within `window_s`) is not restarted again:
the process's give-up handler (`on_give_up`, set by the role's composition root) stops the
role with a non-zero exit, and its supervisor (`aenv up`, systemd's `Restart=`, a
Kubernetes restart) starts it afresh. Never left dead in a live process.

The decision is pure (`on_death`: the deaths seen so far and now → restart after a delay,
or give up), unit-tested apart from the asyncio plumbing below it. A `run()` that returns
ends the supervision: its loop saw its own stop flag.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from bus.tasks import cancel_and_wait

__all__ = [
    "GiveUp",
    "Restart",
    "RestartPolicy",
    "TaskGaveUp",
    "on_death",
    "on_give_up",
    "restarts",
    "supervise",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    """When a dead task is restarted, and when the process gives up on it instead."""

    #: this many deaths within `window_s`: the task is broken for good in this process
    deaths: int = 5
    window_s: float = 60.0
    #: the first restart's delay, doubled for each death in the window up to `cap_s`
    #: (with the defaults a task dying at once gives up after ~7.5 s: 0.5+1+2+4 — well
    #: inside the 60 s after which the fleet takes a silent node for gone)
    first_delay_s: float = 0.5
    cap_s: float = 10.0


DEFAULT = RestartPolicy()


@dataclass(frozen=True)
class Restart:
    """Start the task again after `delay_s`."""

    delay_s: float


@dataclass(frozen=True)
class GiveUp:
    """Restart no more: take the process down (`reason` says why)."""

    reason: str


def on_death(
    deaths: tuple[float, ...], now: float, policy: RestartPolicy = DEFAULT
) -> tuple[tuple[float, ...], Restart | GiveUp]:
    """A task died at `now`, having died at `deaths` before: the deaths to remember (those
    within the window, this one included) and what to do."""
    recent = (*(t for t in deaths if now - t < policy.window_s), now)
    n = len(recent)
    if n >= policy.deaths:
        return recent, GiveUp(f"{n} deaths within {policy.window_s:.0f} s")
    delay = min(policy.first_delay_s * 2.0 ** (n - 1), policy.cap_s)
    return recent, Restart(delay)


class TaskGaveUp(RuntimeError):
    """A supervised task kept dying and no give-up handler was set (a tool, a test)."""


#: restarts per task name since the process started (0 for every supervised name)
_restarts: Counter[str] = Counter()
#: what the process does when a task keeps dying: set by the role's composition root
_give_up: Callable[[str, BaseException], None] | None = None


def restarts() -> dict[str, int]:
    """Restarts per supervised task of this process (what `/metrics` reports)."""
    return dict(_restarts)


def on_give_up(handler: Callable[[str, BaseException], None] | None) -> None:
    """Call `handler(task, last_error)` when a supervised task keeps dying (it should stop
    the process with a non-zero exit). None: the task ends with `TaskGaveUp` instead."""
    global _give_up
    _give_up = handler


class _Cancelled(Exception):
    """The task was cancelled by something other than its owner: a death like any other."""


def supervise(
    name: str,
    run: Callable[[], Coroutine[Any, Any, None]],
    *,
    policy: RestartPolicy = DEFAULT,
) -> asyncio.Task[None]:
    """Run `run()` in a task restarted per `policy` when it dies; cancel the returned task
    (`bus.tasks.cancel_and_wait`) to stop it. `name` labels its logs and metric: a closed
    or fleet-bounded set (never a sandbox id)."""
    _restarts[name] += 0
    return asyncio.create_task(_supervised(name, run, policy), name=name)


async def _supervised(
    name: str, run: Callable[[], Coroutine[Any, Any, None]], policy: RestartPolicy
) -> None:
    deaths: tuple[float, ...] = ()
    while True:
        inner = asyncio.create_task(run(), name=f"{name}:run")
        try:
            await asyncio.wait({inner})
        except asyncio.CancelledError:  # our owner stops us: so does the work
            await cancel_and_wait(inner)
            raise
        if inner.cancelled():
            error: BaseException = _Cancelled(f"task {name} was cancelled from outside")
        elif (raised := inner.exception()) is not None:
            error = raised
        else:
            return
        deaths, decision = on_death(deaths, time.monotonic(), policy)
        if isinstance(decision, GiveUp):
            log.critical(
                "task %s keeps dying (%s); giving up on it", name, decision.reason, exc_info=error
            )
            handler = _give_up
            if handler is None:
                raise TaskGaveUp(f"task {name}: {decision.reason}") from error
            handler(name, error)
            return
        _restarts[name] += 1
        log.error(
            "task %s died (%r); restarting it in %.1f s (%d death(s) within %.0f s)",
            name,
            error,
            decision.delay_s,
            len(deaths),
            policy.window_s,
            exc_info=error,
        )
        await asyncio.sleep(decision.delay_s)
