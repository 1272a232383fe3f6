"""kill -9 of the node at each point of a resume, and of a pause's upload: no sandbox lost.

A failpoint armed with `kill` (`bus.failpoints`) kills the node process exactly there — a
crash a test cannot time from outside: before and after `cont`, between the VM running and
its resume being recorded, in the middle of the upload. For each point a sandbox holding a
file and a secret only in a process's memory (`Rollout`) is paused, the point armed, the
sandbox resumed (or, for an upload point, paused with the point armed) — the node dies
there — and disarmed; once the supervisor's new node serves, the sandbox must be paused or
running, never killed, and come back with its file and its memory.

Which points: `AENV_KILL_POINTS=all` (`make test-scale`), or a comma list of cases; CI runs
`DEFAULT` — the points where the capture is most at stake. A case is a point, or a resume
point with `@uploaded`: its capture durable in the repository before the resume (a fresh
pause's capture is not: its resume cancels the upload). At `resume.before_release` the log
already holds the resume: the restarted node rolls the sandbox back to its capture (paused).

And a resume whose copy of the capture's RAM cannot be made (`resume.copy_ram` raised, as
on a full disk) fails before its guest runs: the sandbox stays paused on its capture.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from aenv.stack.process import free_port
from bus.failpoints import RESUME_POINTS, UPLOAD_POINTS
from domain import sandbox as sb
from tests.reliability.conftest import Stack
from tests.reliability.test_crash_matrix import (
    Rollout,
    _api_ok,
    _durable,
    _log,
    _log_count,
    _role_pid,
    _settled,
    _states,
)
from tests.support import eventually_sync, tagged
from tests.vmstack import running_stack

pytestmark = pytest.mark.vm

PREFIX = tagged("aenvk")
#: every case: each resume point on a fresh capture, two of them on a durable one, and each
#: point of a pause's upload
ALL = (
    *RESUME_POINTS,
    "resume.after_cont@uploaded",
    "resume.before_append@uploaded",
    "resume.before_release@uploaded",
    *UPLOAD_POINTS,
)
#: CI's: the guest running on the RAM file it adopted; the VM up, its resume not recorded
#: (the journal already says running); its resume recorded (the log says running), its
#: capture not released; an upload with every blob sent and no manifest
DEFAULT = (
    "resume.after_cont",
    "resume.before_append",
    "resume.before_release",
    "upload.before_manifest",
)
#: each case run: its sandbox's status once the restarted node settled it
_OUTCOMES: dict[str, str | None] = {}


def _cases() -> tuple[str, ...]:
    chosen = os.environ.get("AENV_KILL_POINTS", "").strip()
    if chosen == "all":
        return ALL
    if not chosen:
        return DEFAULT
    cases = tuple(c.strip() for c in chosen.split(",") if c.strip())
    unknown = set(cases) - set(ALL)
    assert not unknown, f"AENV_KILL_POINTS: unknown cases {sorted(unknown)}; known: {ALL}"
    return cases


@pytest.fixture(scope="module")
def rstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack of its own whose roles read a failpoints file (`armed`); named `rstack` so
    that a failure report carries its log's tail (the package's hook)."""
    if os.geteuid() != 0:
        pytest.skip("the stack runs microVMs: needs root")
    data = tmp_path_factory.mktemp("aenv-kill-points")
    env = {
        **{k: v for k, v in os.environ.items() if k != "AENV_KILL_POINTS"},  # (the test's)
        "AENV_SLOT_PREFIX": PREFIX,
        "AENV_NODE_ID": "kp",
        "AENV_PROXY_VIA_NODE": "1",
        "AENV_TLS_PORT": str(free_port()),
        "AENV_FAILPOINTS_FILE": str(data / "failpoints"),
    }
    with running_stack(data, env, PREFIX) as exports:
        yield Stack(data, exports["E2B_API_URL"], exports["E2B_API_KEY"], env)
    seen = Counter(_OUTCOMES.values())
    lost = sum(n for status, n in seen.items() if status not in ("paused", "running"))
    print(
        f"\n[kill-points] {len(_OUTCOMES)} cases: {lost} sandboxes lost; "
        f"after the crash {dict(seen)}"
    )


def _armed(st: Stack) -> Path:
    return Path(st.env["AENV_FAILPOINTS_FILE"])


def _arm(st: Stack, point: str) -> None:
    _armed(st).write_text(f"{point}=kill\n")
    time.sleep(1.3)  # a running process looks at the file at most once a second


def _dead(pid: int) -> bool:
    """Gone, or a zombie its supervisor has not reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _killed_at_the_point(st: Stack, pid: int, point: str) -> None:
    """The node died at the point: disarmed at once (the new node must not die there
    again), then its replacement serves."""
    serving = _log_count(st, "serving")
    try:
        eventually_sync(lambda: _dead(pid), timeout=300, interval=0.05)
    finally:
        _armed(st).write_text("")
    log = (st.data_dir / "aenv.log").read_text(errors="replace")
    assert f"failpoint {point}: kill -9" in log, f"the node died elsewhere than at {point}"
    eventually_sync(lambda: _role_pid(st, "node") != pid, timeout=120, interval=0.2)
    eventually_sync(lambda: _log_count(st, "serving") > serving, timeout=300, interval=0.5)
    eventually_sync(lambda: _api_ok(st), timeout=120, interval=0.2)


def _in_background(fn: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        try:
            fn()
        except Exception as e:  # cut by the crash, as expected
            print(f"  (call cut by the crash: {type(e).__name__}: {e})")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", _cases())
def test_node_killed_at_a_point_loses_no_sandbox(rstack: Stack, case: str) -> None:
    point, _, variant = case.partition("@")
    r = Rollout.start()
    sid = r.sandbox_id
    pid = _role_pid(rstack, "node")
    call: threading.Thread | None = None
    if point in UPLOAD_POINTS:  # the pause's own upload dies there
        _arm(rstack, point)
        Sandbox.pause(sid)
    else:
        Sandbox.pause(sid)
        if variant == "uploaded":
            eventually_sync(lambda: _durable(rstack, [sid]), timeout=180, interval=1.0)
        _arm(rstack, point)
        call = _in_background(lambda: Sandbox.connect(sid, timeout=900))
    _killed_at_the_point(rstack, pid, point)
    if call is not None:
        call.join(300)
    _settled(rstack)
    after_crash = _OUTCOMES[case] = _states(rstack).get(sid)
    assert after_crash in ("paused", "running"), f"{case}: sandbox {sid} {after_crash}: lost"
    durable = _durable(rstack, [sid]) if after_crash == "paused" else None
    r.check(Sandbox.connect(sid, timeout=900))
    print(
        f"\n[kill-points] {case}: node killed at the point; after its restart the sandbox "
        f"was {after_crash} (capture durable: {durable}); resumed with its file and memory"
    )
    Sandbox.kill(sid)


@pytest.mark.timeout(600)
def test_a_resume_without_room_for_the_captures_copy_leaves_it_paused(rstack: Stack) -> None:
    r = Rollout.start()
    sid = r.sandbox_id
    Sandbox.pause(sid)
    _armed(rstack).write_text("resume.copy_ram\n")  # raised each time: as on a full disk
    time.sleep(1.3)  # (a running process looks at the file at most once a second)
    try:
        with pytest.raises(Exception, match="stays paused") as refused:
            Sandbox.connect(sid, timeout=900)
    finally:
        _armed(rstack).write_text("")
    _settled(rstack)
    assert _states(rstack).get(sid) == "paused", f"{sid}: {_states(rstack).get(sid)}"
    failed = [
        e.event.reason
        for e in _log(rstack)
        if isinstance(e.event, sb.SandboxResumeFailed) and e.event.sandbox_id == sid
    ]
    assert failed and "no room for a copy of the capture's RAM" in failed[-1], failed
    time.sleep(1.3)  # (the node sees the file disarmed)
    r.check(Sandbox.connect(sid, timeout=900))  # the capture was never spent
    print(
        f"\n[kill-points] resume.copy_ram: refused ({type(refused.value).__name__}), "
        f"sandbox paused ({failed[-1]!r}); resumed with its file and memory"
    )
    Sandbox.kill(sid)
