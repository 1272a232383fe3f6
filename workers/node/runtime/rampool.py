"""Ready copies of template RAM files, made in the background.

A sandbox that may later pause needs its own RAM file (share=on), i.e. a copy of its
template's: ~100-150 MiB of allocated pages for a 512 MiB guest, 50-100 ms of copying. Kept
ready ahead of time, a create only renames one into place. The copies are made once the
restores in flight are over (`settled`), at the lowest priority: copying 100+ MiB competes
for the CPU and disk with the restore that just took one, and with its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from workers.node.foreground import in_background
from workers.node.runtime.memfile import clone_or_sparse_copy

log = logging.getLogger(__name__)


class RamPool:
    def __init__(
        self,
        root: Path,
        *,
        settled: Callable[[], Awaitable[None]],
        pause_point: Callable[[], None],
        per_source: int = 2,
    ) -> None:
        self.root = root
        self.per_source = per_source
        self._settled = settled
        self._pause_point = pause_point
        self._ready: dict[Path, list[Path]] = {}
        self._filling: dict[Path, asyncio.Task[None]] = {}
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("*.mem"):  # copies from before a restart: sources unknown
            stale.unlink(missing_ok=True)

    def take(self, source: Path) -> Path | None:
        """A ready copy of `source` (the caller owns it now), or None; refills either way."""
        ready = self._ready.get(source, [])
        copy = ready.pop() if ready else None
        self._refill(source)
        return copy

    def _refill(self, source: Path) -> None:
        task = self._filling.get(source)
        if task is None or task.done():
            self._filling[source] = asyncio.create_task(self._fill(source))

    async def _fill(self, source: Path) -> None:
        ready = self._ready.setdefault(source, [])
        while len(ready) < self.per_source and source.exists():
            await self._settled()
            if not source.exists():  # its snapshot was deleted while we waited
                return
            dst = self.root / f"{uuid.uuid4().hex}.mem"
            try:
                await in_background(clone_or_sparse_copy, source, dst, self._pause_point)
            except OSError as e:
                if source.exists():
                    log.warning("RAM pool: copying %s failed: %s", source, e)
                dst.unlink(missing_ok=True)
                return
            ready.append(dst)

    async def close(self) -> None:
        for task in self._filling.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for copies in self._ready.values():
            for c in copies:
                c.unlink(missing_ok=True)
        self._ready.clear()
