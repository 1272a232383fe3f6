"""The node's disk budget from its settings alone, until `budget.py::DiskBudget` (S8) takes
its place behind the same two callables: what the heartbeat says (`disk_budget`,
`disk_room`) and what a create is checked against (`openings.py`).

No budget set (`AENV_DISK_BUDGET_BYTES` unset): no disk check at all — the heartbeat says
None, which placement reads as "unknown, eligible". With one, the room is what the last
disk walk left under it; nothing is counted as evictable (no eviction yet).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["FixedBudget", "room_under"]


def room_under(budget: int | None, used: int | None) -> int | None:
    """Bytes left under `budget` with `used` allocated (None: no budget; a walk not done
    yet counts as nothing used — the budget is all the node knows)."""
    if budget is None:
        return None
    return max(0, budget - (used or 0))


class FixedBudget:
    """A budget of `budget` bytes over what `used` reports (`DiskUsage.used`)."""

    def __init__(self, budget: int | None, used: Callable[[], int | None]) -> None:
        self._budget = budget
        self._used = used

    def budget(self) -> int | None:
        return self._budget

    def room(self) -> int | None:
        return room_under(self._budget, self._used())
