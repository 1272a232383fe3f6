"""Which event loop the long-running processes (the API and node roles) run on.

uvloop when it is installed (it is a dependency): every command a sandbox's lifecycle
needs crosses several event-loop hops — HTTP in, NATS out, NATS into the node, the event
back, HTTP out — and each costs less on uvloop's libuv loop than on the stdlib's, which
is what the control plane's overhead over a raw restore is made of. `AENV_EVENT_LOOP=asyncio`
picks the stdlib loop (to compare, or to rule the loop out when something misbehaves).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["loop_name", "run"]

T = TypeVar("T")

#: The environment variable that overrides the choice: "uvloop" or "asyncio".
ENV = "AENV_EVENT_LOOP"


def loop_name() -> str:
    """The loop `run` will use: uvloop unless told otherwise or not installed."""
    wanted = os.environ.get(ENV, "uvloop").strip().lower() or "uvloop"
    if wanted not in ("uvloop", "asyncio"):
        raise SystemExit(f"{ENV} must be 'uvloop' or 'asyncio' (got {wanted!r})")
    if wanted == "uvloop":
        try:
            import uvloop  # noqa: F401
        except ImportError:
            return "asyncio"
    return wanted


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the chosen loop."""
    if loop_name() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
