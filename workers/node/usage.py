"""What this node's VMs cost the host, read from procfs: their resident memory and the CPU
time their QEMU processes used, summed per node (a series per sandbox would be unbounded);
and how much of their memory is shared with other processes (`Smaps`, from
`/proc/<pid>/smaps_rollup`: fork children's untouched guest pages, QEMU's own code) —
the one parser of that file, the benches' PSS figures included.

The CPU total is a counter over the node's life: a VM that is gone keeps what it had used
when last read (the last few seconds of a VM killed between two reads are not counted —
its process is reaped, its numbers gone with it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, fields

__all__ = ["CpuTally", "Smaps", "Usage", "parse_smaps_rollup", "read_smaps", "read_usage"]

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


@dataclass(frozen=True)
class Smaps:
    """A process's memory as `smaps_rollup` sums it over all its mappings, in bytes.

    `pss` charges each page to the processes mapping it in equal parts, so the PSS of all
    processes adds up to what they hold together; `shared` is pages another process maps
    too (counted whole here), `private` the pages only this one maps: rss = shared +
    private. `Smaps` add up (`+`, `sum(…, Smaps())`) for a node's total."""

    rss: int = 0
    pss: int = 0
    shared: int = 0
    private: int = 0

    def __add__(self, other: Smaps) -> Smaps:
        return Smaps(
            self.rss + other.rss,
            self.pss + other.pss,
            self.shared + other.shared,
            self.private + other.private,
        )


#: the names of `Smaps`' figures (the `kind` of the node's guest-memory series)
SMAPS_FIELDS = tuple(f.name for f in fields(Smaps))
#: `smaps_rollup` field → what of `Smaps` it adds to (values are in kB)
_ROLLUP = {
    "Rss": "rss",
    "Pss": "pss",
    "Shared_Clean": "shared",
    "Shared_Dirty": "shared",
    "Private_Clean": "private",
    "Private_Dirty": "private",
}


def parse_smaps_rollup(text: str) -> Smaps:
    """The fields of one `/proc/<pid>/smaps_rollup` (lines `Name:   123 kB`); fields it does
    not know (newer kernels add some) are skipped, missing ones are 0."""
    got = dict.fromkeys(SMAPS_FIELDS, 0)
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        field = _ROLLUP.get(name)
        if not sep or field is None:
            continue
        value = rest.split()
        if value and value[0].isdigit():
            got[field] += int(value[0]) * 1024
    return Smaps(**got)


def read_smaps(pid: int, proc: str = "/proc") -> Smaps | None:
    """A process's `Smaps`, None when it is gone. Not cheap: the kernel walks every page
    table of the process (~5 ms for a QEMU with 512 MiB of guest RAM under TCG), so read it
    once per scrape, off the event loop."""
    try:
        with open(f"{proc}/{pid}/smaps_rollup") as f:
            return parse_smaps_rollup(f.read())
    except (OSError, ValueError):
        return None


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
