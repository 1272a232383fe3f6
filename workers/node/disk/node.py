"""The node's `DiskBudget` made from its settings, and kept: the minute's walk replaces its
tally, and what `room` and `pinned` cost (a listing of the entries, a look at open files)
is paid there, in the background, not by each heartbeat or scrape."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from workers.node.disk.budget import DiskBudget, budget_of
from workers.node.disk.evictor import CacheEvictor
from workers.node.disk.watch import SCAN_EVERY_S, DiskUsage
from workers.node.foreground import in_background
from workers.node.settings import NodeSettings

__all__ = ["NodeDisk"]

log = logging.getLogger(__name__)

#: The least time between walks: what `changed` waits for, so a burst of kills is one walk
SOON_S = 3.0


class NodeDisk:
    """The budget, its evictor and the last room it worked out (for the heartbeat)."""

    def __init__(self, settings: NodeSettings, image_cache: Path | None) -> None:
        roots = [settings.state_dir] + ([image_cache] if image_cache is not None else [])
        self.usage = DiskUsage(settings.state_dir, image_cache)
        self.evictor = CacheEvictor(image_cache, settings.state_dir)
        self.budget = DiskBudget(
            self.usage,
            budget_of(roots, bytes_=settings.disk_budget_bytes, share=settings.disk_budget_share),
            headroom=settings.disk_headroom_bytes,
            evictor=self.evictor,
        )
        self._evictable: int | None = None
        self._pinned: int | None = None
        self._changed = asyncio.Event()

    def held_by(self, paths: Callable[[], Iterable[Path]]) -> None:
        """What captures and the runtime stand on (base images, runtime disks): never
        evicted under them (`CacheEvictor.held`)."""
        self.evictor.held = paths

    def used(self) -> int | None:
        """Bytes held per the ledger; None before the first walk ended."""
        return self.budget.used() if self.usage.last is not None else None

    def room(self) -> int | None:
        """Free under the budget now plus what could be evicted as of the last walk."""
        if self._evictable is None:
            return None
        return self.budget.free() + self._evictable

    def pinned(self) -> int | None:
        return self._pinned

    def numbers(self) -> dict[str, int | None]:
        """For the scrape (`NodeMetrics.watch`)."""
        return {"budget": self.budget.budget, "room": self.room(), "pinned": self.pinned()}

    async def refresh(self) -> None:
        await self.budget.refresh()
        plan, _ = await in_background(self.budget.plan_for, 0)
        self._evictable = plan.evictable
        self._pinned = await in_background(self.budget.pinned)

    def changed(self) -> None:
        """Disk was freed or taken outside the ledger (a sandbox's VM and files gone): walk
        again soon. Its room is what the API places by; a minute-old room turns creates
        away with 503 right after kills made room (the catalogue test saw it)."""
        self._changed.set()

    async def run_forever(self, every_s: float = SCAN_EVERY_S, soon_s: float = SOON_S) -> None:
        try:  # what a removal or a build killed with the last run left: before any walk
            await in_background(self.evictor.sweep)
        except Exception as e:
            log.warning("disk sweep at start failed: %s", e)
        while True:
            self._changed.clear()  # a change during the walk asks for the next one
            try:
                await self.refresh()
            except Exception as e:  # a walk that failed is tried again on the next round
                log.warning("disk walk failed: %s", e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), every_s)
            await asyncio.sleep(soon_s)  # a burst of kills is one walk, not one each

    def blob_cache_room(self, cap: int, held: Callable[[], int]) -> Callable[[], int]:
        """The repository blob cache's budget: what it holds plus what the disk has free,
        never above `cap` (`blob_cache_bytes`)."""

        def room() -> int:
            if self.usage.last is None:  # no walk yet: no number to go by but the cap
                return cap
            return min(cap, held() + self.budget.free())

        return room
