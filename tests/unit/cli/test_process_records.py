"""The stack's process records: a pid counts as ours only with the start time we saw, so
`aenv down`/`up` after a supervisor's kill -9 stop what it left and nothing else."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from aenv.stack.records import (
    ProcessBook,
    is_zombie,
    leftovers,
    parse_start_time,
    start_time,
    stop_leftovers,
)

STAT = "4242 (weird) name)) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1 2"


def test_start_time_is_read_after_the_last_paren() -> None:
    assert parse_start_time(STAT) == 987654
    assert parse_start_time(STAT.replace(") S ", ") Z ")) is None  # a zombie is gone


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_recorded_process_is_found_and_stopped(tmp_path: Path) -> None:
    # SIGINT at its default: a shell's background job (CI started with `&`) has it ignored
    child = subprocess.Popen(["sleep", "60"], preexec_fn=_default_sigint)
    try:
        book = ProcessBook(tmp_path)
        book.note("sleeper", child.pid, stop_signal=signal.SIGINT)
        assert [r.name for r in leftovers(tmp_path)] == ["sleeper"]
        assert stop_leftovers(tmp_path, timeout=5) == ["sleeper"]
        assert child.wait(5) == -signal.SIGINT
        assert leftovers(tmp_path) == []
    finally:
        child.kill()
        child.wait()


def test_a_reused_pid_is_not_ours(tmp_path: Path) -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        ProcessBook(tmp_path).note("sleeper", child.pid)
        path = tmp_path / "processes.json"
        records = json.loads(path.read_text())
        records[0]["start_time"] -= 1  # as if the pid now named another process
        path.write_text(json.dumps(records))
        assert stop_leftovers(tmp_path, timeout=1) == []
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_the_data_dir_lock_tells_a_live_supervisor(tmp_path: Path) -> None:
    """Held by another process (as the supervisor holds it), the lock says "alive"; once
    that process is gone, the kernel released it."""
    from aenv.stack.records import supervisor_alive

    assert not supervisor_alive(tmp_path)
    (tmp_path / "aenv.lock").touch()
    hold = (
        "import fcntl, sys, time; f = open(sys.argv[1]); "
        "fcntl.flock(f, fcntl.LOCK_EX); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / "aenv.lock")])
    try:
        deadline = time.monotonic() + 5
        while not supervisor_alive(tmp_path):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        holder.kill()
        holder.wait()
    assert not supervisor_alive(tmp_path)


def test_an_unreaped_child_is_a_zombie_and_a_reaped_one_is_gone() -> None:
    """Why `_clear_lock` needs it: `start_time` says gone, `kill(pid, 0)` (Postgres's own
    check of a pid file) says alive."""
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while not is_zombie(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert is_zombie(child.pid)
    assert start_time(child.pid) is None
    os.kill(child.pid, 0)  # no error: a zombie still "exists"
    child.wait()
    assert not is_zombie(child.pid)
    assert not is_zombie(os.getpid())
