"""Disk the node frees off the command path: layers no live VM, paused capture or
template stacks on any more (killed sandboxes, compacted chains), and fork captures once
no child maps their RAM.

Layer GC reads every chain with qemu-img — CPU the next create or resume should not share
— so it runs a few seconds after the kill, resume or delete that asked for it, after the
restores in flight (foreground first), and many requests in a row coalesce into one run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from workers.node.runtime import Runtime, Snapshot

__all__ = ["GC_DELAY_S", "Garbage"]

log = logging.getLogger(__name__)

#: Layer GC runs this long after the kill/resume/delete that asked for it.
GC_DELAY_S = 3.0


class Garbage:
    def __init__(self, runtime: Runtime, roots: Callable[[], list[Snapshot]]) -> None:
        self.runtime = runtime
        #: the captures whose layers stay (paused sandboxes', templates'); live VMs the
        #: runtime knows itself
        self.roots = roots
        #: captures made for forks: their RAM file is mapped by the running children, so
        #: each is kept until none of its children runs any more
        self.fork_captures: list[Snapshot] = []
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        #: asked for since the current round began
        self._again = False

    def collect_soon(self) -> None:
        """A collection a few seconds from now; asked while one is under way, another
        round follows it (a kill landing during a collection that still saw its VM
        running would otherwise wait for the next kill: a lost wake-up)."""
        self._again = True
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._later())

    async def _later(self) -> None:
        while self._again:
            self._again = False
            await asyncio.sleep(GC_DELAY_S)
            await self.runtime.foreground.settled()  # housekeeping: after the restores
            try:
                freed = await self.collect()
                if freed:
                    log.info("freed %d unused disk layers", freed)
            except Exception as e:  # GC is best effort; the next kill retries
                log.warning("layer GC failed: %s", e)

    async def collect(self) -> int:
        """Free what nothing needs now; returns how many disk layers went."""
        async with self._lock:
            self._drop_unmapped_fork_captures()
            return await self.runtime.collect_layers(self.roots())

    def _drop_unmapped_fork_captures(self) -> None:
        """A fork capture's own files (RAM, device state) go once no running VM maps its
        RAM; its disk layer stays as long as a child's chain stacks on it (layer GC)."""
        mapped = {vm.mem_file for vm in self.runtime.vms.values()}
        for capture in list(self.fork_captures):
            if capture.mem not in mapped:
                self.runtime.delete_snapshot(capture)
                self.fork_captures.remove(capture)
                log.info("fork capture %s freed: no child maps it", capture.snapshot_id)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
