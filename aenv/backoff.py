"""When to restart a process that died: the supervisor's one restart policy, for roles and
embedded services alike. Pure, so its numbers are unit-tested without processes.

The supervisor never gives up: a role or server that crashes keeps being restarted, its
delay doubling up to `cap_s`, and a run that lasted `stable_s` forgives the earlier
crashes. Giving up would take the rest of the stack down with it — a crash-looping API
must not stop the node and its VMs, and a dead Postgres must come back by itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: First restart after this long: a crash at start-up (a port still in TIME_WAIT, a server
#: not yet back) often clears within a second.
FIRST_DELAY_S = 0.5
#: Longest wait between restarts: an operator who fixed the cause sees it back soon.
CAP_S = 30.0
#: A run this long counts as healthy: the next crash starts the backoff again.
STABLE_S = 60.0


def restart_delay(crashes: int, *, first_s: float = FIRST_DELAY_S, cap_s: float = CAP_S) -> float:
    """Seconds to wait before restart number `crashes` (1 = the first crash)."""
    if crashes <= 0:
        return 0.0
    return min(first_s * 2.0 ** min(crashes - 1, 32), cap_s)


@dataclass
class CrashRecord:
    """A process's crash streak: crashes since it last ran for `stable_s`."""

    cap_s: float = CAP_S
    stable_s: float = STABLE_S
    streak: int = 0
    total: int = 0
    started_at: float | None = field(default=None)

    def started(self, now: float) -> None:
        self.started_at = now

    def crashed(self, now: float) -> float:
        """Record a crash at `now`; the delay before the next start."""
        ran = now - self.started_at if self.started_at is not None else 0.0
        self.streak = 1 if ran >= self.stable_s else self.streak + 1
        self.total += 1
        self.started_at = None
        return restart_delay(self.streak, cap_s=self.cap_s)
