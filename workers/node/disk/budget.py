"""`DiskBudget`: the one limit on what a node keeps on disk (images-at-scale S8), and the
ledger that keeps every write under it.

The budget is a setting (`disk_budget_bytes`), or a share (`disk_budget_share`) of the
filesystems holding the state dir and the image cache (summed when they differ). Writes
stay `headroom` below it: running VMs' top layers grow without asking anyone.

What is used comes from the minute's walk (`DiskUsage`) plus what changed since: producers
`reserve` before they write (a context manager; concurrent reservations add up) and say on
leaving what they left behind (`Reservation.charge`), evictions subtract what they freed.
So `used() + reserved()` never passes the limit, whatever is written between walks. A walk
replaces the tally; additions made while it ran are kept on top of it (counted twice until
the next walk rather than missed), removals made while it ran are dropped (the walk may have
seen the file: counted once more rather than missed). Errs high, never low.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from workers.node.disk.evict import Entry, Plan, plan
from workers.node.disk.usage import Tally, allocated
from workers.node.disk.watch import DiskUsage
from workers.node.ports import HostError

__all__ = ["DiskBudget", "Evictor", "NoRoom", "Reservation", "budget_of", "no_room_message"]

log = logging.getLogger(__name__)

DEFAULT_SHARE = 0.8
DEFAULT_HEADROOM = 1 << 30


class Evictor(Protocol):
    """What can go, and how it goes (`evictor.CacheEvictor`)."""

    def entries(self) -> list[Entry]: ...

    def in_use(self) -> Collection[str]:
        """Keys of entries something uses now (files a VM has open)."""
        ...

    def remove(self, entry: Entry) -> int:
        """Remove it; the bytes that freed."""
        ...


#: Plans made and carried out for one need before giving up (`_fits_after_eviction`)
EVICTION_ROUNDS = 4


class NoRoom(HostError):
    """A write that does not fit even after eviction: `unavailable`, so placement hands
    the create to another node."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="unavailable")


def no_room_message(need: int, evictable: int, free: int) -> str:
    return f"node disk budget: need {_mib(need)}, {_mib(evictable)} evictable, {_mib(free)} free"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def budget_of(
    roots: Iterable[Path], *, bytes_: int | None = None, share: float = DEFAULT_SHARE
) -> int:
    """`bytes_` if set, else `share` of each distinct filesystem holding a root (a root
    not made yet: its nearest existing parent's)."""
    if bytes_ is not None:
        return bytes_
    sizes: dict[int, int] = {}
    for root in roots:
        here = root
        while not here.exists() and here != here.parent:
            here = here.parent
        st = os.statvfs(here)
        sizes[os.stat(here).st_dev] = st.f_blocks * st.f_frsize
    return int(share * sum(sizes.values()))


@dataclass
class Reservation:
    """Room held for a write in progress; `charge` what the write left on disk."""

    nbytes: int
    charged: int = 0
    since: float = 0.0

    def charge(self, nbytes: int) -> None:
        self.charged += nbytes


class _NoEvictor:
    def entries(self) -> list[Entry]:
        return []

    def in_use(self) -> Collection[str]:
        return ()

    def remove(self, entry: Entry) -> int:
        return 0


class DiskBudget:
    """The node's disk budget over its `DiskUsage`; thread-safe (builds run in threads)."""

    def __init__(
        self,
        usage: DiskUsage,
        budget: int,
        *,
        headroom: int = DEFAULT_HEADROOM,
        evictor: Evictor | None = None,
        on_evicted: Callable[[Entry], None] | None = None,
    ) -> None:
        self.usage = usage
        self.budget = budget
        self.headroom = headroom
        self.evictor: Evictor = evictor or _NoEvictor()
        self.on_evicted = on_evicted or (lambda _: None)
        self._lock = threading.RLock()
        self._evicting = threading.Lock()  # one eviction at a time: plans see the same disk
        self._base: int | None = None
        self._delta = 0  # since the last walk began
        self._walk_adds: int | None = None  # additions while a walk runs
        self._reservations: list[Reservation] = []
        self._pins: Counter[str] = Counter()
        #: running VMs' dirs → (what each may grow to, what it held when last measured)
        self._growth: dict[Path, tuple[int, int]] = {}
        #: running VMs' dirs → what the tally counts for each: its size when it began
        #: growing (no more than its start's charge), then as the start of each walk that
        #: ended measured it (no more than that walk counted)
        self._counted: dict[Path, int] = {}

    # ---- the tally ---------------------------------------------------------------------
    def used(self) -> int:
        """Bytes the roots hold now, by the last walk and what changed since (high, never
        low). Walks once, blocking, if none has run."""
        if self._base is None:
            self.walk()
        with self._lock:
            return (self._base or 0) + self._delta

    def reserved(self) -> int:
        with self._lock:
            held = sum(max(0, r.nbytes - r.charged) for r in self._reservations)
            growth = list(self._growth.items())
        return held + sum(max(0, cap - had) for path, (cap, had) in growth if path.exists())

    def grows(self, path: Path, cap: int) -> None:
        """A running VM's directory grows without asking: its RAM file fills as the guest
        touches memory (a sandbox reading 200 MiB of files took ~150 MiB more), its top
        layer as it writes. What it may still add, up to `cap`, counts as reserved while
        the directory is there; each walk measures it again as it begins (an earlier
        measure than the walk's own: counted high, never low)."""
        had = allocated(path)
        with self._lock:
            self._growth[path] = (cap, had)
            self._counted[path] = had

    def stops_growing(self, path: Path) -> None:
        """The VM of that directory grows no more (a pause: its capture reserves the RAM
        it moves): nothing stays held for it."""
        with self._lock:
            self._growth.pop(path, None)
            self._counted.pop(path, None)

    def gone(self, path: Path) -> None:
        """A VM's directory was deleted (a kill): what the tally counts for it leaves now,
        not at the walk after — the next create on this node is placed by that room (the
        catalogue's creates right after kills met 503s). Never more than the tally counts:
        what the directory grew since is only held (`grows`), and goes with the entry."""
        with self._lock:
            self._growth.pop(path, None)
            counted = self._counted.pop(path, None)
        if counted:
            self.removed(counted)

    def _measure_growth(self) -> dict[Path, int]:
        """Each running VM's size as a walk begins (what that walk counts at least)."""
        with self._lock:
            growth = dict(self._growth)
        now = {p: (cap, allocated(p)) for p, (cap, _) in growth.items() if p.exists()}
        with self._lock:
            for p in growth:  # a VM gone meanwhile is gone; one added meanwhile is kept
                if p in now:
                    self._growth[p] = now[p]
                else:
                    self._growth.pop(p, None)
                    self._counted.pop(p, None)
        return {p: had for p, (_, had) in now.items()}

    def accounted(self) -> int:
        """What the budget counts against itself: held plus promised to writes running."""
        used = self.used()
        return used + self.reserved()

    @property
    def limit(self) -> int:
        """Where writes stop: the budget less the headroom for running VMs."""
        return max(0, self.budget - self.headroom)

    def free(self) -> int:
        return max(0, self.limit - self.accounted())

    def added(self, nbytes: int) -> None:
        """A producer wrote `nbytes` outside a reservation (or a walk's news)."""
        with self._lock:
            self._delta += nbytes
            if self._walk_adds is not None:
                self._walk_adds += nbytes

    def removed(self, nbytes: int) -> None:
        with self._lock:
            self._delta -= nbytes

    def walk(self) -> Tally:
        """A full walk now (blocking), which replaces the tally."""
        with self._walking() as ended:
            return ended(self.usage.walk_now())

    async def refresh(self) -> Tally:
        """The minute's walk (`DiskUsage.refresh`, in the background), replacing the tally."""
        with self._walking() as ended:
            return ended(await self.usage.refresh())

    @contextmanager
    def _walking(self) -> Iterator[Callable[[Tally], Tally]]:
        """A walk's window: what is added while it runs is kept on top of the tally it
        ends with (`ended`); one that fails replaces nothing."""
        measured = self._measure_growth()
        with self._lock:
            self._walk_adds = 0

        def ended(tally: Tally) -> Tally:
            with self._lock:
                self._base = tally.total
                self._delta = self._walk_adds or 0
                for p, had in measured.items():  # this walk counted at least that
                    if p in self._counted:
                        self._counted[p] = had
            log.info(
                "disk walk: %s, %s added while it ran",
                _mib(tally.total),
                _mib(self._delta),
                extra={"disk_event": "walk", "disk_bytes": tally.total},
            )
            return tally

        try:
            yield ended
        finally:
            with self._lock:
                self._walk_adds = None

    # ---- pins and use ------------------------------------------------------------------
    def pin(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._pins.update(keys)

    def unpin(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._pins.subtract(keys)
            for k in [k for k, n in self._pins.items() if n <= 0]:
                del self._pins[k]

    @contextmanager
    def pinned_while(self, keys: Iterable[str]) -> Iterator[None]:
        held = list(keys)
        self.pin(held)
        try:
            yield
        finally:
            self.unpin(held)

    def pins(self) -> set[str]:
        with self._lock:
            return set(self._pins)

    def pinned(self) -> int:
        """Bytes of entries that cannot go now (pinned or in use)."""
        held = self.pins() | set(self.evictor.in_use())
        return sum(e.bytes for e in self.evictor.entries() if e.key in held)

    @staticmethod
    def touch(entry: Path) -> None:
        """Mark an entry used now (its stamp orders eviction: least recently used first)."""
        with suppress(OSError):
            os.utime(entry)

    # ---- room ----------------------------------------------------------------------------
    def plan_for(self, need: int, kept: Iterable[str] = ()) -> tuple[Plan, int]:
        """The eviction plan that would make `need` bytes fit, and the free room now;
        `kept`: entries a removal just now could not free (left out of this plan)."""
        free = self.free()
        short = need - free
        entries = self.evictor.entries()
        busy = self.pins() | set(self.evictor.in_use()) | set(kept)
        busy |= self._in_flight(entries)
        return plan(entries, max(0, short), busy), free

    def _in_flight(self, entries: list[Entry]) -> set[str]:
        """Regenerable entries made since the oldest open reservation began: a build in
        flight may stand on them (a chain it unpacks over, blobs it just pulled)."""
        with self._lock:
            if not self._reservations:
                return set()
            since = min(r.since for r in self._reservations)
        return {e.key for e in entries if e.category != "image" and e.last_used >= since}

    def room(self) -> int:
        """Free under the budget plus what could be evicted (heartbeat `disk_room`)."""
        p, free = self.plan_for(0)
        return free + p.evictable

    def make_room(self, need: int) -> bool:
        """Evict until `need` bytes fit under the limit; False (nothing evicted) if they
        cannot. The ENOSPC watcher and reservations call it."""
        with self._evicting:
            return self._fits_after_eviction(need)

    @contextmanager
    def reserve(
        self, nbytes: int, *, evict: bool = True, refuse: bool = True
    ) -> Iterator[Reservation]:
        """Room for a write of up to `nbytes`, made by eviction if needed, held until the
        block ends; then what it `charge`d counts as used. Raises `NoRoom` if it cannot fit.
        `evict=False`: only what is free now (a cache's copy never evicts another cache).
        `refuse=False`: a write that must happen whatever the budget says (a pause: refusing
        it loses the user's state) goes ahead over the limit with a warning, its reservation
        held all the same, so the writes after it make the room back or are refused."""
        with self._evicting:  # made room and took it, with no other reservation between
            fits = self._fits_after_eviction(nbytes) if evict else self.free() >= nbytes
            if not fits:
                p, free = self.plan_for(nbytes)
                if refuse:
                    raise NoRoom(no_room_message(nbytes, p.evictable, free))
                log.warning(
                    "over the budget, written anyway: %s",
                    no_room_message(nbytes, p.evictable, free),
                )
            r = Reservation(nbytes, since=time.time() - 1)  # mtimes have coarse clocks
            with self._lock:
                self._reservations.append(r)
            self._note("reserved", r)
        try:
            yield r
        finally:
            with self._lock:
                self._reservations.remove(r)
                self._delta += r.charged
                if self._walk_adds is not None:
                    self._walk_adds += r.charged
            self._note("charged", r)

    def _note(self, what: str, r: Reservation) -> None:
        """One line per reservation opened and closed, with the ledger after it: an overrun
        seen by `du` is found in the log by its time (what was promised, what was left)."""
        log.info(
            "disk %s: %s (charged %s); ledger used %s, reserved %s, limit %s",
            what,
            _mib(r.nbytes),
            _mib(r.charged),
            _mib((self._base or 0) + self._delta),
            _mib(self.reserved()),
            _mib(self.limit),
            extra={"disk_event": what, "disk_bytes": r.nbytes, "disk_charged": r.charged},
        )

    def _fits_after_eviction(self, need: int) -> bool:
        """Evict by plan until `need` fits. An entry may free less than the plan counted
        (blocks shared by hard links, a capture's layers that layer GC frees later), so
        after each round the plan is made again from what is there now; a round that
        finds too little to evict ends it (no cache destroyed in vain)."""
        if self.free() >= need:
            return True  # no listing: a reservation that fits costs no I/O
        kept: set[str] = set()
        for _ in range(EVICTION_ROUNDS):
            p, free = self.plan_for(need, kept)
            if free >= need:
                return True
            if not p.enough or not p.evict:
                return False
            for entry in p.evict:
                freed = self.evictor.remove(entry)
                self.removed(freed)
                self.on_evicted(entry)
                if freed <= 0:
                    kept.add(entry.key)  # held (a download): the next plan looks elsewhere
        return self.free() >= need
