"""A fork from a thread while the main thread is inside an import: with logging's
before-fork hook taking its lock first and the import lock second, and the import's
weakref callback wanting logging's lock, the process hung for good (the node role, in CI).
`forksafe` makes forks take the import lock first. Run in a child interpreter, bounded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import _imp, logging, os, sys, threading, time
if sys.argv[1] == "fixed":
    from workers.node.net import forksafe
    forksafe.install()
go = threading.Event()
def forker():
    go.wait()
    pid = os.fork()
    if pid == 0:
        import json  # the child can import: it does not inherit a held import lock
        os._exit(0)
    os.waitpid(pid, 0)
_imp.acquire_lock()           # the main thread is inside an import...
t = threading.Thread(target=forker); t.start()
go.set(); time.sleep(0.3)     # ...when another thread forks...
logging._acquireLock()        # ...and a weakref callback of the import wants logging's lock
logging._releaseLock()
_imp.release_lock()
t.join()
print("ok")
"""

ROOT = Path(__file__).resolve().parents[3]


def _run(mode: str, timeout: float = 6) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            [sys.executable, "-c", SCRIPT, mode],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        return None


def test_a_fork_from_a_thread_during_an_import_does_not_deadlock() -> None:
    done = _run("fixed")
    assert done is not None, "deadlocked"
    assert done.stdout.strip() == "ok", done.stderr


def test_without_it_the_same_fork_deadlocks() -> None:
    """The hazard is real on this interpreter (else the test above proves nothing)."""
    # the plain run imports nothing of ours: it would end in well under a second
    assert _run("plain", timeout=2.5) is None
