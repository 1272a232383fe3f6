"""How many warm VMs of each template a node keeps: pure decisions, no VMs.

A warm VM costs host memory (the pages its restore and warm-up touched) and a network slot
while it waits; a create that finds none pays the cold restore (~200 ms under TCG) and its
first command the cold guest (~250 ms more). So the pool follows demand: it refills up to
the largest number of creates a template had within any few seconds of the recent past (a
burst of 16 rollouts wants 16), decays when the template goes quiet, and never outgrows
its memory budget — nor the room real sandboxes leave (`spare_mib`): a warm VM is the
first thing a node gives up.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from domain import template as tp

__all__ = ["Demand", "WarmPolicy", "passes_on", "targets", "warmable"]


@dataclass(frozen=True)
class WarmPolicy:
    #: warm VMs of one template at most
    max_per_template: int = 8
    #: memory (MiB, the templates' nominal sizes) all warm VMs of a node may hold
    budget_mib: int = 4096
    #: a template created from within `idle_s` keeps at least this many
    floor: int = 1
    #: demand is the most creates within any window this long...
    window_s: float = 5.0
    #: ...over this much history: a burst is remembered this long, then forgotten
    history_s: float = 120.0
    #: without a create for this long a template keeps none (but those in `keep`)
    idle_s: float = 600.0
    #: templates kept at `floor` even before their first create (the default template)
    keep: frozenset[str] = field(default_factory=frozenset)


class Demand:
    """When each template's recent creates came (monotonic seconds), pruned to the
    history the policy looks at."""

    def __init__(self, policy: WarmPolicy) -> None:
        self.policy = policy
        self._at: dict[str, deque[float]] = {}
        self._last: dict[str, float] = {}

    def record(self, template: str, now: float) -> None:
        times = self._at.setdefault(template, deque())
        times.append(now)
        self._last[template] = now
        self._prune(times, now)

    def forget(self, template: str) -> None:
        self._at.pop(template, None)
        self._last.pop(template, None)

    def peak(self, template: str, now: float) -> int:
        """The most creates of `template` inside one `window_s` within the history."""
        times = self._at.get(template)
        if not times:
            return 0
        self._prune(times, now)
        ordered = list(times)
        w = self.policy.window_s
        return max(
            (bisect.bisect_right(ordered, t + w) - i for i, t in enumerate(ordered)), default=0
        )

    def idle_for(self, template: str, now: float) -> float | None:
        """Seconds since the template's last create; None if never (or forgotten)."""
        last = self._last.get(template)
        return None if last is None else now - last

    def templates(self) -> list[str]:
        return list(self._last)

    def _prune(self, times: deque[float], now: float) -> None:
        horizon = now - self.policy.history_s
        while times and times[0] < horizon:
            times.popleft()


def warmable(template: str) -> bool:
    """Whether creates of `template` count as demand for warm VMs. Not a paused sandbox's
    capture lent to its fork children (`tp.paused_capture_template`): its `count` children
    are all created at once and it is never created again, so VMs warmed from that demand
    would only hold memory until the parent is killed (three seen after a 3-way fork)."""
    return not tp.is_paused_capture_template(template)


def wanted(demand: Demand, template: str, now: float) -> int:
    """One template's target before the budget: its recent peak, at least the floor while
    it is in use (or kept), at most the per-template cap."""
    p = demand.policy
    idle = demand.idle_for(template, now)
    in_use = idle is not None and idle <= p.idle_s
    floor = p.floor if (in_use or template in p.keep) else 0
    return min(p.max_per_template, max(floor, demand.peak(template, now) if in_use else 0))


def targets(
    demand: Demand,
    sizes: Mapping[str, int],
    now: float,
    *,
    spare_mib: int,
    known: Iterable[str] = (),
) -> dict[str, int]:
    """Warm VMs wanted per template, within the budget and `spare_mib` (memory the node's
    sandboxes leave free, counting what the pool holds now as free: it is the pool's to
    give up). `sizes`: each template's memory (MiB); a template without one is skipped.
    The most recently used templates are served first; each gets its floor before any
    gets more than that, so one bursty template cannot starve the others."""
    p = demand.policy
    candidates = set(demand.templates()) | set(p.keep) | set(known)
    want = {t: wanted(demand, t, now) for t in candidates if t in sizes}
    want = {t: n for t, n in want.items() if n > 0}

    def recency(t: str) -> tuple[bool, float]:
        idle = demand.idle_for(t, now)
        return (idle is None, idle or 0.0)

    order = sorted(want, key=recency)
    left = min(p.budget_mib, spare_mib)
    out = dict.fromkeys(order, 0)
    for pass_floor in (True, False):
        for t in order:
            goal = min(want[t], p.floor) if pass_floor else want[t]
            while out[t] < goal and sizes[t] <= left:
                out[t] += 1
                left -= sizes[t]
    return {t: n for t, n in out.items() if n > 0}


def passes_on(held_on: tuple[str, ...], node_id: str, held: int) -> bool:
    """Whether a node passes a create on (once): other nodes said they hold something of
    its template (`held_on`, from their heartbeats: a warm VM, its capture), and this one
    holds none of it (`held`) — it would restore cold what they would hand over, or fetch
    what they have on disk."""
    return bool(held_on) and node_id not in held_on and held == 0
