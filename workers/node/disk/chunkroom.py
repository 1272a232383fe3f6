"""The block service's chunk cache inside the node's disk budget (issue 29).

The cache caps itself (LRU under `AENV_BLOCKS_CACHE_BYTES`), so the budget never evicts
it; but what it may grow to is disk the budget must not promise to anything else. It is
held the way a running VM's directory is (`DiskBudget.grows`): the walk counts what the
cache holds (category `blob_cache`), and what it may still add, up to its cap, counts as
reserved for the service's life. Held + may-add = the cap, counted once: neither a pin
(a pin keeps entries from eviction; it reserves no room a cache has not written yet) nor
a `reserve` held for ever (a reservation's start marks every entry made since as a build
in flight, never evicted; and it would count the cap on top of what the walk finds).

A cap the budget cannot hold is lowered to what the cache holds plus half of what the
budget has free, with a warning: the service runs with less cache rather than the node
overrunning its disk, and the other half stays for VMs, images and captures (a hold that
took all the free room would have the node turn every create away, and it is never
evicted). Never below `MIN_CAP_BYTES`: lazy VMs need the service to serve at all.

The fit is made again while the node runs (`refit_chunk_cache`, every `REFIT_EVERY_S`): a
cap lowered at start rises back toward its setting once the budget has room again, and
one the budget can no longer hold comes down to what the cache holds plus half the free
room. The new cap is held in the budget and written for the service (`shared/blockcap.py`),
which takes it within a second (a lower one evicts at once). Changes under `REFIT_STEP` are
left alone (but a return to the setting is not): the walks' figures move a little all the
time.
"""

from __future__ import annotations

import logging
from pathlib import Path

from shared.blockcap import write_cap
from workers.node.disk.budget import DiskBudget
from workers.node.disk.usage import allocated

__all__ = [
    "MIN_CAP_BYTES",
    "REFIT_EVERY_S",
    "REFIT_STEP",
    "chunk_cache_cap",
    "hold_chunk_cache",
    "refit_chunk_cache",
]

log = logging.getLogger(__name__)

#: 16 chunks of 4 MiB: what concurrent reads pin at once, with room to turn over.
MIN_CAP_BYTES = 64 << 20


#: The share of the budget's free room a cap that does not fit may take.
FREE_SHARE = 0.5
#: How often the node fits the cap to the budget again.
REFIT_EVERY_S = 30.0
#: A new fit that differs less than this from the cap in force is not applied.
REFIT_STEP = 64 << 20


def chunk_cache_cap(cap: int, held: int, free: int, floor: int = MIN_CAP_BYTES) -> int:
    """The cap the cache gets: its setting if what it holds plus `FREE_SHARE` of what the
    budget has free holds it, else that much; never below `floor` (nor above the setting)."""
    return max(min(cap, held + int(free * FREE_SHARE)), min(cap, floor))


def _within(path: Path, roots: list[Path]) -> bool:
    path = path.resolve()
    return any(path.is_relative_to(r.resolve()) for r in roots)


def hold_chunk_cache(budget: DiskBudget, directory: Path, cap: int) -> int:
    """Hold the cache's room in `budget` for as long as the node runs (blocking: a walk
    if none ran yet) and return the cap the service must be started with. A cache dir
    outside the budget's roots (`AENV_BLOCKS_CACHE_DIR` on a disk of its own) is not the
    budget's: its cap is left as set."""
    if not _within(directory, [root for _, root in budget.usage.roots]):
        log.info("block cache %s is outside the disk budget's roots: not held in it", directory)
        return cap
    directory.mkdir(parents=True, exist_ok=True)
    held = allocated(directory)  # counted by the walks already: in `used`, not in `free`
    chosen = chunk_cache_cap(cap, held, budget.free())
    if chosen < cap:
        log.warning(
            "block cache cap lowered from %d to %d MiB: the node's disk budget has no more room "
            "(AENV_BLOCKS_CACHE_BYTES, AENV_DISK_BUDGET_BYTES)",
            cap >> 20,
            chosen >> 20,
        )
    budget.grows(directory, chosen)
    write_cap(directory, chosen)
    return chosen


def refit_chunk_cache(
    budget: DiskBudget, directory: Path, cap: int, current: int, step: int = REFIT_STEP
) -> int:
    """The cap fitted again to the budget's room now (blocking: a walk of the cache dir),
    held and written for the service when it moved by `REFIT_STEP` or more; returns the
    cap in force. `cap` is the setting, `current` the cap the service has: the room the
    budget reserves for the cache's growth is the cache's own, so it counts as free here
    (else each fit would shrink the next)."""
    if not _within(directory, [root for _, root in budget.usage.roots]):
        return current
    held = allocated(directory)
    own = max(0, current - held)
    free = max(0, budget.limit - budget.accounted() + own)
    chosen = chunk_cache_cap(cap, held, free)
    if abs(chosen - current) < step and not (chosen == cap != current):
        return current
    log.info("block cache cap %d -> %d MiB (disk budget)", current >> 20, chosen >> 20)
    budget.grows(directory, chosen)
    write_cap(directory, chosen)
    return chosen
