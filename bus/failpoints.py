"""Failpoints: named places in the code where a test can make a running process fail.

The project tests faults by injecting them, not by reasoning about them: a test arms
`heartbeat.beat` in a live node and watches what the fleet does when that task raises. A
failpoint is a call, `failpoint("heartbeat.beat")`, that does nothing unless that name is
armed, and then raises `FailpointError` there — or, armed with the `kill` action, kills
its own process with SIGKILL there: a crash at an exact point (between two steps of a
resume, say), which a test cannot time from outside.

It exists for tests, and is compiled into every build so that the process under test is
the one that ships. It is inert unless `AENV_FAILPOINTS_FILE` names a file: with no such
variable a call is one attribute test; with one, the file is looked at (a `stat`) at most
once a second, and read again only when it changed — so a test arms or disarms a failpoint
in a RUNNING process by writing the file, without restarting it. Never set the variable
in production.

The file holds one failpoint a line, `#` starts a comment:

    heartbeat.beat        # raises every time it is reached
    consumer.fetch=3      # raises the next 3 times, then is inert until the file changes
    resume.after_cont=kill  # kill -9 of the process the first time it is reached

A killed process reads the file afresh when it starts again: the test disarms a `kill`
point once it saw the process die, before the supervisor's restart reaches it again.

Places that call one (grep `failpoint(`): `heartbeat.beat` (the node's heartbeat loop),
`consumer.fetch` (every durable consumer's pull loop), `timer.tick` (the TTL timer), and
the steps of a resume and of a pause's upload on a node (`RESUME_POINTS`, `UPLOAD_POINTS`),
and `resume.copy_ram` (the copy of a capture's RAM file a resume makes: raised there, the
copy fails as on a full disk).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ENV",
    "RESUME_POINTS",
    "UPLOAD_POINTS",
    "Armed",
    "FailpointError",
    "Failpoints",
    "failpoint",
    "parse",
    "reset",
]

log = logging.getLogger(__name__)

#: The variable naming the file of armed failpoints (unset: every failpoint is inert)
ENV = "AENV_FAILPOINTS_FILE"
#: How often the file is looked at, at most: a failpoint on a hot path costs a clock read
CHECK_EVERY_S = 1.0
#: The action of a `NAME=kill` line: SIGKILL of the process at that point
KILL = "kill"

#: The steps of a resume on its node, in order (`workers/node`): a crash at each must leave
#: the sandbox paused or resumable (tests/reliability/test_resume_kill_points.py)
RESUME_POINTS = (
    "resume.before_restore",  # the resume decided, nothing started
    "resume.after_launch",  # QEMU up on the adopted RAM file, the capture's copy not kept yet
    "resume.before_cont",  # the capture has its RAM copy; the guest not running
    "resume.after_cont",  # the guest runs on the RAM file it adopted
    "resume.after_envd",  # envd initialised: the VM is the sandbox's
    "resume.before_append",  # before `SandboxResumed` is appended
    "resume.before_release",  # `SandboxResumed` appended, the capture not released yet
)
#: The steps of a pause's upload by the node's snapshot worker, in order
UPLOAD_POINTS = (
    "upload.before_put",  # the capture about to be sent
    "upload.before_manifest",  # its blobs sent, its manifest not written: not durable
    "upload.before_record",  # durable, about to append `SnapshotUploaded`
    "upload.after_record",  # recorded, the event not acked
)


class FailpointError(RuntimeError):
    """Raised where an armed failpoint is reached: an injected fault, nothing else."""


@dataclass(frozen=True)
class Armed:
    """One armed failpoint: how many times it still fires (None: every time), and whether
    it raises or kills its process."""

    count: int | None = None
    kill: bool = False


def parse(text: str) -> dict[str, Armed]:
    """The armed names of a failpoints file. A malformed line is logged and skipped."""
    armed: dict[str, Armed] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, value = line.partition("=")
        name, value = name.strip(), value.strip()
        if not sep:
            armed[name] = Armed()
        elif value.isdigit():
            armed[name] = Armed(int(value))
        elif value == KILL:
            armed[name] = Armed(1, kill=True)
        else:
            log.warning("failpoints: ignored %r (expected NAME, NAME=COUNT or NAME=kill)", raw)
    return armed


@dataclass
class Failpoints:
    """The armed failpoints of one file, reread when it changes (size, mtime or inode)."""

    path: Path
    check_every_s: float = CHECK_EVERY_S
    armed: dict[str, Armed] = field(default_factory=dict)
    _checked_at: float | None = None
    _seen: tuple[int, int, int] | None = None

    def fire(self, name: str, now: float) -> Armed | None:
        """How `name` fires now, or None (its count, if it has one, goes down by one)."""
        if self._checked_at is None or now - self._checked_at >= self.check_every_s:
            self._checked_at = now
            self._refresh()
        armed = self.armed.get(name)
        if armed is None or armed.count is None:
            return armed
        if armed.count <= 0:
            return None
        self.armed[name] = Armed(armed.count - 1, armed.kill)
        return armed

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
    """Raise `FailpointError(name)` if `name` is armed (kill -9 this process if armed with
    `kill`); otherwise nothing."""
    points = _current()
    armed = points.fire(name, time.monotonic()) if points is not None else None
    if armed is None:
        return
    if armed.kill:
        log.warning("failpoint %s: kill -9 of this process (pid %d)", name, os.getpid())
        for handler in logging.getLogger().handlers:  # the line reaches the log first
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    raise FailpointError(f"failpoint {name}")


def reset() -> None:
    """Read `AENV_FAILPOINTS_FILE` again at the next call (for tests that set it)."""
    global _points
    _points = _UNSET
