"""What this node's VMs cost the host, read from procfs: their resident memory and the CPU
time their QEMU processes used, summed per node (a series per sandbox would be unbounded).

The CPU total is a counter over the node's life: a VM that is gone keeps what it had used
when last read (the last few seconds of a VM killed between two reads are not counted —
its process is reaped, its numbers gone with it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["CpuTally", "Usage", "read_usage"]

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Usage:
    rss_bytes: int
    cpu_s: float


def read_usage(pid: int, proc: str = "/proc") -> Usage | None:
    """A process's resident set and CPU time (user + system), None when it is gone."""
    try:
        with open(f"{proc}/{pid}/statm") as f:
            resident = int(f.read().split()[1])
        with open(f"{proc}/{pid}/stat") as f:
            stat = f.read()
    except (OSError, ValueError, IndexError):
        return None
    # fields after the command name (which may hold spaces and parentheses): state is
    # field 3, utime and stime are fields 14 and 15
    rest = stat[stat.rfind(")") + 2 :].split()
    try:
        utime, stime = int(rest[11]), int(rest[12])
    except (IndexError, ValueError):
        return None
    return Usage(resident * _PAGE, (utime + stime) / _TICK)


class CpuTally:
    """CPU seconds of every VM this node ran: the live ones as read now, plus what the ones
    that are gone had used when last seen."""

    def __init__(self) -> None:
        self._last: dict[int, float] = {}
        self._gone_s = 0.0

    def total(self, live: Iterable[tuple[int, float]]) -> float:
        """`live`: (pid, cpu seconds) of each VM read now."""
        now = dict(live)
        for pid, cpu in self._last.items():
            if pid not in now:
                self._gone_s += cpu
        # a pid reused by a new VM starts below its predecessor: count the old one as gone
        for pid, cpu in now.items():
            if cpu < self._last.get(pid, 0.0):
                self._gone_s += self._last[pid]
        self._last = now
        return self._gone_s + sum(now.values())
