"""Ready copies of template RAM files, made in the background.

A sandbox that may later pause needs its own RAM file (share=on), i.e. a copy of its
template's: ~100-150 MiB of allocated pages for a 512 MiB guest, 50-100 ms of copying. Kept
ready ahead of time, a create only renames one into place. The copies are made once the
restores in flight are over (`settled`), at the lowest priority: copying 100+ MiB competes
for the CPU and disk with the restore that just took one, and with its answer.

Each source keeps one ready copy, and `per_source` (2) once a create found none while its
refill was under way: a template created now and then costs one copy of its RAM on disk
beside its capture, not two; one created in bursts keeps two. (A create that finds none
because the budget dropped it, or there was no room, does not count.)

The pool is a cache, so it is bounded and forgets: a source's copies go with the source
(`forget`, `forget_under`: its capture was deleted — a template deleted or rebuilt, a paused
sandbox's capture removed), and the whole pool stays within a byte budget, least recently
used sources dropped first (`plan_room`). Before both, every template build left its two
copies behind for good (87 builds: 176 files, 25 GB).

Its copies are disk bytes too, under the node's disk budget (`disk`): each takes room that
is free before it is made (a copy that does not fit is not made: it never evicts), and the
budget may drop ready copies (`ready_files`, `drop`) like any cache entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from workers.node.disk.budget import DiskBudget, NoRoom, Reservation
from workers.node.foreground import in_background
from workers.node.ports import RamPoolStats
from workers.node.runtime.memfile import allocated_bytes, clone_or_sparse_copy

__all__ = ["DEFAULT_BUDGET", "Held", "RamPool", "RamPoolStats", "plan_room"]

log = logging.getLogger(__name__)

#: ~7 templates' worth of copies (2 x ~145 MiB each for a 512 MiB guest): the templates a
#: node serves most keep theirs, a build's one-off template ages out.
DEFAULT_BUDGET = 2 << 30

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Held:
    """What the pool holds for one source: bytes of its copies (made and being made), and
    when a create last asked for one (the monotonic clock)."""

    bytes: int
    last_used: float


def plan_room(held: Mapping[K, Held], *, budget: int, need: int, taker: K) -> list[K] | None:
    """The sources whose copies go so that `need` more bytes for `taker` fit in `budget`,
    least recently used first (ties: by key, so the choice is the same every time); None
    when they would not fit even with every other source dropped — then nothing is
    dropped for a copy that cannot be made."""
    total = sum(h.bytes for h in held.values())
    if held.get(taker, Held(0, 0.0)).bytes + need > budget:
        return None
    out: list[K] = []
    others = sorted(
        ((k, h) for k, h in held.items() if k != taker),
        key=lambda kh: (kh[1].last_used, str(kh[0])),
    )
    for k, h in others:
        if total + need <= budget:
            break
        out.append(k)
        total -= h.bytes
    return out


@dataclass
class _Source:
    #: ready copies (path → allocated bytes), the newest last
    copies: dict[Path, int] = field(default_factory=dict)
    last_used: float = 0.0
    #: estimated bytes of the copy being made (0: none)
    copying: int = 0
    #: copies kept ready: one, until a create found none while a refill was under way
    #: (creates faster than one copy refills): then `per_source`
    want: int = 1
    task: asyncio.Task[None] | None = None

    @property
    def bytes(self) -> int:
        return sum(self.copies.values()) + self.copying


class RamPool:
    def __init__(
        self,
        root: Path,
        *,
        settled: Callable[[], Awaitable[None]],
        pause_point: Callable[[], None],
        per_source: int = 2,
        budget_bytes: int = DEFAULT_BUDGET,
    ) -> None:
        self.root = root
        self.per_source = per_source
        self.budget = budget_bytes
        self._settled = settled
        self._pause_point = pause_point
        self._sources: dict[Path, _Source] = {}
        #: the node's disk budget (None: copies count against this pool's bytes only)
        self.disk: DiskBudget | None = None
        self._making: set[Path] = set()  # copies being written: never listed as ready
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("*.mem"):  # copies from before a restart: sources unknown
            stale.unlink(missing_ok=True)

    def take(self, source: Path) -> Path | None:
        """A ready copy of `source` (the caller owns it now), or None; refills either way."""
        src = self._sources.setdefault(source, _Source())
        src.last_used = time.monotonic()
        copy = src.copies.popitem()[0] if src.copies else None
        refilling = src.task is not None and not src.task.done()
        if copy is None and refilling:  # not after a drop for the budget, or no room
            src.want = self.per_source
        if not refilling:
            src.task = asyncio.create_task(self._fill(source, src))
        return copy

    def forget(self, source: Path) -> None:
        """`source` is going (its capture is deleted): its ready copies go now, and its
        refill stops — at once while it waits for a quiet moment; a copy already under way
        is deleted when it ends (the thread making it cannot be interrupted)."""
        src = self._sources.pop(source, None)
        if src is None:
            return
        if src.task is not None and not src.copying:
            src.task.cancel()
        for copy in list(src.copies):  # (`drop` may take one from the budget's thread)
            copy.unlink(missing_ok=True)
        src.copies.clear()

    def forget_under(self, directory: Path) -> None:
        """Every source inside `directory` (a capture directory being removed)."""
        for source in [s for s in self._sources if s.is_relative_to(directory)]:
            self.forget(source)

    async def idle(self) -> None:
        """Until no refill is under way (a bench's or test's steady state)."""
        while tasks := [s.task for s in self._sources.values() if s.task and not s.task.done()]:
            await asyncio.wait(tasks)

    def ready_files(self) -> list[Path]:
        """The copies ready on disk (the disk budget's entries; from its thread)."""
        making = set(self._making)
        return [p for p in sorted(self.root.glob("*.mem")) if p not in making]

    def drop(self, path: Path) -> bool:
        """Remove a ready copy for the node's disk budget (from its thread: one dict pop
        each); False when a create took it meanwhile, or it is not one of this pool's."""
        for src in list(self._sources.values()):
            if src.copies.pop(path, None) is not None:
                path.unlink(missing_ok=True)
                log.debug("RAM pool: %s dropped for the disk budget", path.name)
                return True
        return False

    def stats(self) -> RamPoolStats:
        files = sum(len(s.copies) for s in self._sources.values())
        held = sum(sum(s.copies.values()) for s in self._sources.values())
        return RamPoolStats(held, files, len(self._sources), self.budget)

    def _room_for(self, source: Path, need: int) -> bool:
        """Make room for `need` more bytes of `source`'s copies; False: they cannot fit."""
        for gone in [s for s in self._sources if s != source and not s.exists()]:
            self.forget(gone)  # deleted without a word (a path that missed `forget`)
        held = {s: Held(src.bytes, src.last_used) for s, src in self._sources.items()}
        victims = plan_room(held, budget=self.budget, need=need, taker=source)
        if victims is None:
            return False
        for victim in victims:
            log.info("RAM pool: dropping the copies of %s (least recently used)", victim)
            self.forget(victim)
        return True

    async def _fill(self, source: Path, src: _Source) -> None:
        while len(src.copies) < src.want and source.exists():
            await self._settled()
            if self._sources.get(source) is not src or not source.exists():
                return  # forgotten, or its capture was deleted while we waited
            need = allocated_bytes(source)
            if not self._room_for(source, need):
                return
            dst = self.root / f"{uuid.uuid4().hex}.mem"
            with contextlib.ExitStack() as held:
                room = await self._disk_room(held, need)
                if room is None:
                    return
                src.copying = max(need, 1)
                self._making.add(dst)
                try:
                    await in_background(clone_or_sparse_copy, source, dst, self._pause_point)
                except OSError as e:
                    if source.exists():
                        log.warning("RAM pool: copying %s failed: %s", source, e)
                    dst.unlink(missing_ok=True)
                    return
                except asyncio.CancelledError:  # the node closes
                    dst.unlink(missing_ok=True)
                    raise
                finally:
                    src.copying = 0
                    self._making.discard(dst)
                if self._sources.get(source) is not src:  # forgotten while it was copied
                    dst.unlink(missing_ok=True)
                    return
                made = allocated_bytes(dst)
                room.charge(made)
                src.copies[dst] = made

    async def _disk_room(self, held: contextlib.ExitStack, need: int) -> Reservation | None:
        """Room under the node's disk budget for one copy, held on `held` (a stand-in
        without a budget); None: it is not free now, so no copy is made (a cache never
        evicts for a copy nobody asked for yet). In a thread: the budget's lock may be held
        by an eviction (rmtree)."""
        if self.disk is None:
            return Reservation(need)
        try:
            return await asyncio.to_thread(held.enter_context, self.disk.reserve(need, evict=False))
        except NoRoom as e:
            log.debug("RAM pool: no copy made: %s", e)
            return None

    async def close(self) -> None:
        for src in self._sources.values():
            if src.task is not None:
                src.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await src.task
            for c in list(src.copies):
                c.unlink(missing_ok=True)
        self._sources.clear()
