"""What the TTL timer keeps of a sandbox: its clock — status, node, `end_at`, the action
its lifecycle asks at expiry — folded from the same events as the sandbox, a few fields
instead of the whole state.

A fleet's timer holds every sandbox that has not ended (100,000 of them at scale), and
starts from the read model's rows instead of folding the log from its first event; so it
folds a view small enough to build from a row (`Clock`), and forgets a sandbox when it ends
(`tick` returns None). `clock_of(fold(h)) == fold_clock(h)` for every history `decide`
produces (a property test holds the two folds together).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import assert_never, cast

from pydantic import BaseModel, ConfigDict

from domain.messages import CommandRejected, Event
from domain.sandbox.events import (
    SANDBOX_EVENTS,
    AnySandboxEvent,
    SandboxCreated,
    SandboxDiskFull,
    SandboxFailed,
    SandboxForked,
    SandboxForkRequested,
    SandboxKilled,
    SandboxKillRequested,
    SandboxNetworkUpdated,
    SandboxPaused,
    SandboxPauseRequested,
    SandboxRequested,
    SandboxResumed,
    SandboxResumeFailed,
    SandboxResumeRequested,
    SandboxTimeoutSet,
    SnapshotFailed,
    SnapshotRequested,
    SnapshotTaken,
    SnapshotUploaded,
)
from domain.sandbox.state import Sandbox
from domain.sandbox.values import SandboxStatus

__all__ = ["Clock", "clock_of", "fold_clock", "tick"]

S = SandboxStatus


class Clock(BaseModel):
    model_config = ConfigDict(frozen=True)

    sandbox_id: str
    status: SandboxStatus
    node_id: str | None = None
    end_at: datetime | None = None
    #: "pause" or "kill" (`Lifecycle.on_timeout`)
    on_timeout: str = "kill"
    #: when it was paused (None while it is not): paused sandboxes are kept for a while
    paused_at: datetime | None = None
    #: whether its timeout's pause keeps memory (`Lifecycle.pause_memory`)
    pause_memory: bool = True


def clock_of(state: Sandbox) -> Clock | None:
    """A sandbox's clock; None once it was killed. (A failed one is kept: it may still be
    killed, and a kill whose node died needs completing.)"""
    if state.status is S.KILLED:
        return None
    return Clock(
        sandbox_id=state.sandbox_id,
        status=state.status,
        node_id=state.node_id,
        end_at=state.end_at,
        on_timeout=state.lifecycle.on_timeout,
        paused_at=state.paused_at,
        pause_memory=state.lifecycle.pause_memory,
    )


#: Events that change nothing of a clock but its status (the status they leave).
_STATUS_AFTER: dict[type[AnySandboxEvent], SandboxStatus] = {
    SandboxFailed: S.FAILED,
    SandboxKillRequested: S.KILLING,
    SandboxPauseRequested: S.PAUSING,
    SandboxForkRequested: S.FORKING,
    SnapshotRequested: S.SNAPSHOTTING,
    SandboxForked: S.RUNNING,
    SnapshotTaken: S.RUNNING,
    SnapshotFailed: S.RUNNING,
}


def tick(clock: Clock | None, event: Event) -> Clock | None:
    """The clock after `event`: None for a sandbox that was killed — or that the timer
    never knew (an event of it other than its request: the timer started after it)."""
    if isinstance(event, CommandRejected) or not isinstance(event, SANDBOX_EVENTS):
        return clock
    e = cast(AnySandboxEvent, event)
    if isinstance(e, SandboxRequested):
        return Clock(
            sandbox_id=e.sandbox_id,
            status=S.CREATING,
            node_id=e.spec.node_id,
            on_timeout=e.spec.lifecycle.on_timeout,
            pause_memory=e.spec.lifecycle.pause_memory,
        )
    if clock is None:
        return None
    match e:
        case SandboxCreated() | SandboxResumed():
            return clock.model_copy(
                update={
                    "status": S.RUNNING,
                    "node_id": e.node_id,
                    "end_at": e.end_at,
                    "paused_at": None,
                }
            )
        case (
            SandboxFailed()
            | SandboxKillRequested()
            | SandboxPauseRequested()
            | SandboxForkRequested()
            | SnapshotRequested()
            | SandboxForked()
            | SnapshotTaken()
            | SnapshotFailed()
        ):
            return clock.model_copy(update={"status": _STATUS_AFTER[type(e)]})
        case SandboxResumeRequested():  # on the node doing it, if the request names one
            node = clock.node_id if e.node_id is None else e.node_id
            return clock.model_copy(update={"status": S.RESUMING, "node_id": node})
        case SandboxResumeFailed():  # back on the node it was paused on, if the event names it
            node = clock.node_id if e.node_id is None else e.node_id
            return clock.model_copy(update={"status": S.PAUSED, "node_id": node})
        case SandboxKilled():
            return None
        case SandboxPaused():
            return clock.model_copy(update={"status": S.PAUSED, "paused_at": e.at})
        case SandboxTimeoutSet():
            return clock if e.end_at is None else clock.model_copy(update={"end_at": e.end_at})
        case SnapshotUploaded() | SandboxNetworkUpdated() | SandboxDiskFull():
            return clock
        case _:
            assert_never(e)


def fold_clock(events: Iterable[Event], clock: Clock | None = None) -> Clock | None:
    for event in events:
        clock = tick(clock, event)
    return clock
