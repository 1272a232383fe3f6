"""Keep forked helper processes from talking to our event loop's signal handling.

pyroute2 forks a helper to open netlink sockets inside a network namespace, and stops it
with SIGTERM. A forked child inherits asyncio's signal wakeup fd (a socket shared with the
parent), so the child's Python-level handler wrote "SIGTERM" into *our* loop: the node
shut down whenever a network slot was built. Every child forked by Python code in this
process now drops the wakeup fd and takes default signal dispositions first.
"""

from __future__ import annotations

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


def install() -> None:
    """Idempotent; call before the first fork."""
    global _installed
    if not _installed:
        os.register_at_fork(after_in_child=_reset_in_child)
        _installed = True
