"""Failpoints: named places in the code where a test can make a running process fail.

The project tests faults by injecting them, not by reasoning about them: a test arms
`heartbeat.beat` in a live node and watches what the fleet does when that task raises. A
failpoint is a call, `failpoint("heartbeat.beat")`, that does nothing unless that name is
armed, and then raises `FailpointError` there.

It exists for tests, and is compiled into every build so that the process under test is
the one that ships. It is inert unless `AENV_FAILPOINTS_FILE` names a file: with no such
variable a call is one attribute test; with one, the file is looked at (a `stat`) at most
once a second, and read again only when it changed — so a test arms or disarms a failpoint
in a RUNNING process by writing the file, without restarting it. Never set the variable
in production.

The file holds one failpoint a line, `#` starts a comment:

    heartbeat.beat        # raises every time it is reached
    consumer.fetch=3      # raises the next 3 times, then is inert until the file changes

Places that call one (grep `failpoint(`): `heartbeat.beat` (the node's heartbeat loop),
`consumer.fetch` (every durable consumer's pull loop), `timer.tick` (the TTL timer).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ENV", "FailpointError", "Failpoints", "failpoint", "parse", "reset"]

log = logging.getLogger(__name__)

#: The variable naming the file of armed failpoints (unset: every failpoint is inert)
ENV = "AENV_FAILPOINTS_FILE"
#: How often the file is looked at, at most: a failpoint on a hot path costs a clock read
CHECK_EVERY_S = 1.0


class FailpointError(RuntimeError):
    """Raised where an armed failpoint is reached: an injected fault, nothing else."""


def parse(text: str) -> dict[str, int | None]:
    """The armed names of a failpoints file: how many times each still fires (None:
    every time). A malformed line is logged and skipped."""
    armed: dict[str, int | None] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, count = line.partition("=")
        name = name.strip()
        if not sep:
            armed[name] = None
        elif count.strip().isdigit():
            armed[name] = int(count)
        else:
            log.warning("failpoints: ignored %r (expected NAME or NAME=COUNT)", raw)
    return armed


@dataclass
class Failpoints:
    """The armed failpoints of one file, reread when it changes (size, mtime or inode)."""

    path: Path
    check_every_s: float = CHECK_EVERY_S
    armed: dict[str, int | None] = field(default_factory=dict)
    _checked_at: float | None = None
    _seen: tuple[int, int, int] | None = None

    def fire(self, name: str, now: float) -> bool:
        """Whether `name` fires now (its count, if it has one, goes down by one)."""
        if self._checked_at is None or now - self._checked_at >= self.check_every_s:
            self._checked_at = now
            self._refresh()
        if name not in self.armed:
            return False
        left = self.armed[name]
        if left is None:
            return True
        if left <= 0:
            return False
        self.armed[name] = left - 1
        return True

    def _refresh(self) -> None:
        try:
            st = self.path.stat()
        except OSError:  # no file: nothing armed
            self._seen, self.armed = None, {}
            return
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if seen == self._seen:
            return
        self._seen = seen
        try:
            self.armed = parse(self.path.read_text())
        except (OSError, UnicodeDecodeError) as e:
            log.warning("failpoints: cannot read %s: %s", self.path, e)
            self.armed = {}
        if self.armed:
            log.warning("failpoints armed (tests only): %s", ", ".join(sorted(self.armed)))


_UNSET = object()
_points: Failpoints | object | None = _UNSET


def _current() -> Failpoints | None:
    global _points
    if _points is _UNSET:
        path = os.environ.get(ENV)
        _points = Failpoints(Path(path), CHECK_EVERY_S) if path else None
    assert _points is None or isinstance(_points, Failpoints)
    return _points


def failpoint(name: str) -> None:
    """Raise `FailpointError(name)` if `name` is armed; otherwise nothing."""
    points = _current()
    if points is not None and points.fire(name, time.monotonic()):
        raise FailpointError(f"failpoint {name}")


def reset() -> None:
    """Read `AENV_FAILPOINTS_FILE` again at the next call (for tests that set it)."""
    global _points
    _points = _UNSET
