"""The node's watch on each running VM's writes to a full host disk.

A write that finds the host's disk full (`werror=enospc`, `vmm/argv.py`) stops the VM:
QEMU keeps the write and retries it on `cont`. Left alone such a VM stands still for ever
while the node still calls it running. This watch hears QEMU's `BLOCK_IO_ERROR`
(`nospace: true`, action `stop`), asks the node to make room (`MakeRoom`: evicting what can
be fetched again) and continues the VM; one still stopped on a full disk after
`grace_s` is ended through the death watch with the cause `disk-full`, which the node
records as a `SandboxKilled` with that error — never a stopped VM reported running.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from bus import logcontext
from workers.node.deathwatch import DeathWatch
from workers.node.hosted import LiveSandbox
from workers.node.vmm import VmmError

__all__ = ["ROOM_BYTES", "DiskWatch", "MakeRoom", "Step", "event_time", "next_step", "no_space"]

log = logging.getLogger(__name__)

#: asked to free (bytes) when a VM's write found the host full; whether it freed any
MakeRoom = Callable[[int], Awaitable[bool] | bool]
#: what one stopped VM asks of the node's disk at a time: a few seconds of guest writes
ROOM_BYTES = 256 << 20
#: how long a VM's QEMU takes from the event to the stop (the event comes first), and how
#: long a continued VM gets to show it is writing again before it counts as still full
SETTLE_S = 1.0
#: QEMU's run state of a VM stopped by a drive's error action
IO_ERROR = "io-error"

Step = Literal["over", "retry", "give-up"]


def no_space(event: Mapping[str, Any]) -> str | None:
    """The drive whose write found the host's disk full and stopped the VM, if this QMP
    event says so. Other I/O errors go to the guest (`rerror=report`, `werror=enospc`): no
    stop, nothing for the node to do."""
    if event.get("event") != "BLOCK_IO_ERROR":
        return None
    data = event.get("data") or {}
    if not data.get("nospace") or data.get("action") != "stop":
        return None
    return str(data.get("device") or data.get("node-name") or "?")


def next_step(*, stopped: bool, since: float, now: float, grace_s: float) -> Step:
    """After a try to make room and continue: a VM that runs again has its episode over;
    one still stopped is tried again until `grace_s` after its first stop, then given up."""
    if not stopped:
        return "over"
    return "give-up" if now - since >= grace_s else "retry"


def event_time(event: Mapping[str, Any]) -> float:
    """When QEMU sent a QMP event (unix seconds; 0 when it does not say)."""
    ts = event.get("timestamp") or {}
    return float(ts.get("seconds", 0)) + float(ts.get("microseconds", 0)) / 1e6


def _no_room(_: int) -> bool:
    return False


class DiskWatch:
    """One task per running VM, listening to its QMP events; works under the sandbox's
    lock (a pause or kill under way owns the VM) and only on a VM still registered."""

    def __init__(
        self,
        sandboxes: dict[str, LiveSandbox],
        lock: Callable[[str], asyncio.Lock],
        deaths: DeathWatch,
        *,
        grace_s: float = 10.0,
    ) -> None:
        self.sandboxes = sandboxes
        self.lock = lock
        self.deaths = deaths
        self.grace_s = grace_s
        #: the node's eviction (`workers/node/disk/budget.py`); none: nothing to free
        self.make_room: MakeRoom = _no_room
        self._watchers: set[asyncio.Task[None]] = set()

    def watch(self, live: LiveSandbox) -> None:
        # a context of its own, like the death watch: it outlives the create that started it
        task = asyncio.create_task(self._watch(live), context=contextvars.Context())
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    def close(self) -> None:
        for task in list(self._watchers):
            task.cancel()

    async def _watch(self, live: LiveSandbox) -> None:
        with logcontext.bound(sandbox_id=live.sandbox_id):
            over_at = 0.0  # (wall clock, as QEMU stamps its events)
            try:
                async for event in live.vm.qemu.events("BLOCK_IO_ERROR"):
                    device = no_space(event)
                    # each `cont` of an episode retried the write: its errors are old news
                    if device is None or event_time(event) <= over_at or not self._mine(live):
                        continue
                    await self._episode(live, device)
                    over_at = time.time()
            except VmmError:
                pass  # QEMU went away mid-episode: the death watch reports it

    def _mine(self, live: LiveSandbox) -> bool:
        return self.sandboxes.get(live.sandbox_id) is live and live.vm.qemu.alive

    async def _stopped(self, live: LiveSandbox) -> bool:
        """Whether the VM stands stopped on a drive's error, waiting `SETTLE_S` for it (the
        event comes a moment before the stop; a late event of a VM continued since: no)."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            if await live.vm.qemu.status() == IO_ERROR:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)

    async def _episode(self, live: LiveSandbox, device: str) -> None:
        """From a write that found the host full to the VM running again, or ended."""
        if not await self._stopped(live):
            return
        since = time.monotonic()
        log.warning("sandbox %s: host disk full (drive %s): VM stopped", live.sandbox_id, device)
        while True:
            freed = await self._make_room()
            async with self.lock(live.sandbox_id):
                if not self._mine(live):
                    return  # paused or killed meanwhile: no longer this watch's VM
                if await live.vm.qemu.status() == IO_ERROR:
                    await live.vm.qemu.cont()
            await asyncio.sleep(SETTLE_S)
            if not self._mine(live):
                return
            stopped = await live.vm.qemu.status() == IO_ERROR
            step = next_step(
                stopped=stopped, since=since, now=time.monotonic(), grace_s=self.grace_s
            )
            if step == "over":
                log.info("sandbox %s: VM runs again (room made: %s)", live.sandbox_id, freed)
                return
            if step == "give-up":
                break
        why = f"the host's disk is full: the VM's writes found no room for {self.grace_s:g} s"
        async with self.lock(live.sandbox_id):
            if self._mine(live):
                await self.deaths.end(live, "disk-full", why)

    async def _make_room(self) -> bool:
        try:
            freed = self.make_room(ROOM_BYTES)
            if inspect.isawaitable(freed):
                freed = await freed
            return bool(freed)
        except Exception:  # eviction failing must not leave the VM stopped unwatched
            log.exception("making room on the host's disk failed")
            return False
