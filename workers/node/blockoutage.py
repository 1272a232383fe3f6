"""When the node's block service is down for good (issue 29): what its supervisor decides,
with no I/O, so the rule is tested on numbers.

A VM on a lazy image reads its base through the service; when the service dies, QEMU's NBD
client holds the guest's reads for its `reconnect-delay` (`RECONNECT_DELAY_S`) and
reconnects to a restarted service. A service not back within that window leaves those VMs
with reads failing as I/O errors: a guest that may go on running half-broken (a shell
whose binaries cannot be paged in). Such a VM is ended instead, through the death watch,
with a cause of its own — an event and a count, never a VM left running with I/O errors.
The window is QEMU's own: ending sooner kills VMs a restart would have saved; later leaves
guests reading errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shared.lazybase import LAZY_ROOT

__all__ = ["CAUSE", "WHY", "Outage", "stands_on_lazy"]

#: The death's cause (`aenv_vm_deaths_total{cause}`, the SandboxKilled event's reason).
CAUSE = "block-service"
WHY = "the node's block service is down: the image's blocks cannot be read"


def stands_on_lazy(base_image: Path) -> bool:
    """Whether a VM whose disk chain ends at `base_image` reads it through the service (its
    base is a lazy entry's stub: `shared/lazybase.py`); a raw base does not."""
    return base_image.name == LAZY_ROOT


@dataclass
class Outage:
    """One service's downtime: from the first moment it was seen down (dead, or killed
    for hanging) to the moment one answers again; `due` once per outage after `window_s`."""

    window_s: float
    #: monotonic time the service went down; None while it is up
    since: float | None = None
    #: this outage's VMs were ended already (a second end finds none; a start meanwhile
    #: could not open the service either)
    ended: bool = False

    def down(self, now: float) -> None:
        """The service is down at `now` (its first death in a row starts the clock)."""
        if self.since is None:
            self.since = now

    def up(self) -> None:
        """A service answers again: the next death is a new outage."""
        self.since = None
        self.ended = False

    def lasted(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since

    def due(self, now: float) -> bool:
        """Whether the VMs on lazy images must be ended now: the service has been down
        longer than QEMU holds reads, and they were not ended for this outage yet."""
        if self.since is None or self.ended or self.lasted(now) < self.window_s:
            return False
        self.ended = True
        return True
