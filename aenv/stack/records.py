"""The processes of one stack, recorded so they can be found again without the supervisor.

A SIGKILLed supervisor leaves its `stack.json` pid dead, but its roles and servers may
live on (draining, or a Postgres holding its data dir's lock). `processes.json` under the
data dir names each of them by pid *and* kernel start time: a pid the kernel has since
handed to another process is not ours, and `aenv down`/`aenv up` must never signal it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

FILE = "processes.json"
#: flock'ed by the supervisor for its whole life (`aenv.serve`).
LOCK = "aenv.lock"


def supervisor_alive(data_dir: Path) -> bool:
    """Whether a supervisor holds the data dir's lock — one still starting, before its
    `stack.json` exists, too. The kernel drops the lock however the holder ends."""
    try:
        fd = os.open(data_dir / LOCK, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases it if we took it
    return False


def start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), None if it is gone or a
    zombie. Field 22 of /proc/<pid>/stat, read after the command name's closing paren
    (a name may hold spaces and parens)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return parse_start_time(stat)


def is_zombie(pid: int) -> bool:
    """Whether `pid` has exited but is not reaped yet (state Z): gone for every purpose
    but `kill(pid, 0)`, which still succeeds."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = _stat_fields(stat)
    return bool(fields) and fields[0] == "Z"


def _stat_fields(stat: str) -> list[str]:
    """/proc/<pid>/stat's fields from the third (the state) on."""
    return stat.rsplit(")", 1)[-1].split()


def parse_start_time(stat: str) -> int | None:
    fields = _stat_fields(stat)
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return int(fields[19])  # fields[0] is field 3 (state); field 22 is starttime


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_time: int
    #: What asks it to stop quickly: Postgres's fast shutdown is SIGINT (its SIGTERM waits
    #: for every client to leave).
    stop_signal: int = signal.SIGTERM
    #: Whether it leads a process group of its own (servers do: their helpers go with it).
    group: bool = False

    def alive(self) -> bool:
        return start_time(self.pid) == self.start_time


class ProcessBook:
    """The supervisor's record of its children, rewritten on every (re)start of one."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE
        self.records: dict[str, ProcessRecord] = {}

    def note(
        self, name: str, pid: int, *, stop_signal: int = signal.SIGTERM, group: bool = False
    ) -> None:
        started = start_time(pid)
        if started is None:
            return  # already gone: nothing to find later
        self.records[name] = ProcessRecord(name, pid, started, int(stop_signal), group)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(r) for r in self.records.values()], indent=2))
        tmp.replace(self.path)


def leftovers(data_dir: Path) -> list[ProcessRecord]:
    """The recorded processes of the stack under `data_dir` that still run."""
    try:
        raw = json.loads((data_dir / FILE).read_text())
        records = [ProcessRecord(**r) for r in raw]
    except (OSError, ValueError, TypeError):
        return []
    return [r for r in records if r.alive()]


def _signal(rec: ProcessRecord, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if rec.group:
            os.killpg(rec.pid, sig)
        else:
            os.kill(rec.pid, sig)


def stop_leftovers(data_dir: Path, timeout: float) -> list[str]:
    """Stop what a dead supervisor left running: each its stop signal, SIGKILL after
    `timeout`. Returns the names of the processes it found."""
    found = leftovers(data_dir)
    for rec in found:
        _signal(rec, rec.stop_signal)
    deadline = time.monotonic() + timeout
    while any(r.alive() for r in found) and time.monotonic() < deadline:
        time.sleep(0.1)
    for rec in found:
        if rec.alive():
            _signal(rec, signal.SIGKILL)
    while any(r.alive() for r in found) and time.monotonic() < deadline + 5:
        time.sleep(0.1)
    return [r.name for r in found]
