"""The node's watch on each running VM's QEMU: one that exits without being asked (the
memory cgroup killed it, the guest panicked) must become an event, not a sandbox that stays
`running` until the next command fails."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import signal
from collections.abc import Callable

from bus import logcontext
from workers.node.hosted import LiveSandbox
from workers.node.ports import Died

__all__ = ["DeathWatch", "cause_of"]

log = logging.getLogger(__name__)


def cause_of(code: int, *, oom: bool) -> tuple[str, str]:
    """(cause, why) of a QEMU that exited unasked with status `code`. SIGBUS is what a VM
    gets when its guest touches RAM its memory file (on the node's disk) cannot grow into:
    the host's disk is full — often before any disk write of the guest found it so."""
    if oom:
        return (
            "oom",
            f"the VM ran out of memory (its cgroup's OOM killer ended QEMU, status {code})",
        )
    if code == -signal.SIGBUS:
        return "disk-full", "the host's disk is full: the VM's memory file could not grow (SIGBUS)"
    return "crash", f"the VM exited unexpectedly (QEMU status {code})"


class DeathWatch:
    """One task per running VM, waiting for its QEMU to exit; a pause or kill that asked
    for the exit holds the sandbox's lock and takes it out of `sandboxes` first."""

    def __init__(
        self, sandboxes: dict[str, LiveSandbox], lock: Callable[[str], asyncio.Lock]
    ) -> None:
        #: the host's running sandboxes (shared, not copied): the one the watch started for
        #: is no longer there once its end was asked for
        self.sandboxes = sandboxes
        self.lock = lock
        self.died: Died | None = None
        #: (cause, why) of VMs the node ended itself (`end`), reported as their death
        self._ends: dict[str, tuple[str, str]] = {}
        self._watchers: set[asyncio.Task[None]] = set()

    def watch(self, live: LiveSandbox) -> None:
        # a context of its own: the watch outlives the create that started it, and its
        # lines (a death) must not read as part of that create's trace
        task = asyncio.create_task(self._watch(live), context=contextvars.Context())
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def end(self, live: LiveSandbox, cause: str, why: str) -> None:
        """End a VM that cannot go on (its host's disk is full): killed here, reported by
        its watch like a death of `cause` — the one way a VM ends without being asked.
        The caller holds the sandbox's lock and knows the VM is still the sandbox's."""
        self._ends[live.sandbox_id] = (cause, why)
        await live.vm.qemu.kill()

    async def end_where(
        self, stands: Callable[[LiveSandbox], bool], cause: str, why: str
    ) -> list[str]:
        """End every running VM `stands` picks (those on a block service down for good),
        each under its sandbox's lock and only if it is still the sandbox's (a pause or
        kill may have taken it meanwhile); their watches report them as deaths of `cause`.
        Returns the sandboxes ended."""
        ended: list[str] = []
        for live in list(self.sandboxes.values()):
            if not stands(live):
                continue
            async with self.lock(live.sandbox_id):
                if self.sandboxes.get(live.sandbox_id) is not live or not live.vm.qemu.alive:
                    continue
                log.warning("sandbox %s: ending its VM: %s", live.sandbox_id, why)
                await self.end(live, cause, why)
                ended.append(live.sandbox_id)
        return ended

    async def _watch(self, live: LiveSandbox) -> None:
        with logcontext.bound(sandbox_id=live.sandbox_id):
            await self._await_death(live)

    async def _await_death(self, live: LiveSandbox) -> None:
        code = await live.vm.qemu.wait_exit()
        async with self.lock(live.sandbox_id):  # a pause or kill under way asked for it
            ended = self._ends.pop(live.sandbox_id, None)
            if self.sandboxes.get(live.sandbox_id) is not live:
                return
        tail = live.vm.qemu.console_tail(600).strip().splitlines()[-3:]
        cause, why = ended or cause_of(code, oom=live.vm.qemu.oom_killed())
        log.warning("sandbox %s: %s; console: %s", live.sandbox_id, why, " | ".join(tail))
        if self.died is not None:
            await self.died(live.sandbox_id, why, cause)

    def close(self) -> None:
        for task in list(self._watchers):
            task.cancel()
