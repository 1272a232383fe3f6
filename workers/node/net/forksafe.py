"""Keep forked helper processes from talking to our event loop's signal handling.

pyroute2 forks a helper to open netlink sockets inside a network namespace, and stops it
with SIGTERM. A forked child inherits asyncio's signal wakeup fd (a socket shared with the
parent), so the child's Python-level handler wrote "SIGTERM" into *our* loop: the node
shut down whenever a network slot was built. Every child forked by Python code in this
process now drops the wakeup fd and takes default signal dispositions first.

A fork from a thread also deadlocked the node (seen in CI, the node role hung for good
at start-up): `os.fork` runs logging's before-fork hook (takes logging's lock), then takes
the interpreter's import lock — while the main thread, inside an import, held the import
lock and, from a weakref callback of that import, waited for logging's lock. Forks now take
the import lock first (our hook, registered after logging's, runs before it), the same
order as an import, so the two cannot cross.
"""

from __future__ import annotations

import _imp
import contextlib
import os
import signal

_installed = False


def _reset_in_child() -> None:
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, signal.SIG_DFL)


def _release_import_lock() -> None:
    with contextlib.suppress(RuntimeError):  # not held: nothing to give back
        _imp.release_lock()


def _child() -> None:
    _release_import_lock()
    _reset_in_child()


def install() -> None:
    """Idempotent; call before the first fork (after `logging` is imported: before-fork
    hooks run in reverse order of registration)."""
    global _installed
    if not _installed:
        os.register_at_fork(
            before=_imp.acquire_lock, after_in_parent=_release_import_lock, after_in_child=_child
        )
        _installed = True
