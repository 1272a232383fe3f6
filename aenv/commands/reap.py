"""`aenv rm --all` / `aenv rm -m KEY=VALUE`: kill every sandbox a filter selects, as E2B's
`sandbox kill -a [-s STATE] [-m K=V]` does, and say how many.

Unlike E2B's (running only unless `-s` says), `--all` means running *and* paused: aenv
pauses a sandbox when its timeout ends, so the paused ones are what piles up. Without
`-s` it is one request, server-side (`POST /sandboxes/bulk/kill`, `api/bulk.py`): every
sandbox matching when the request reaches the log; with `-s` the CLI lists and kills.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import typer

from aenv.commands.common import EXIT_USAGE, die, sdk_errors

if TYPE_CHECKING:
    from aenv.config import Connection

__all__ = ["kill_matching"]

#: kills in flight at once: each waits for its sandbox's node to answer
PARALLEL = 8


def kill_matching(conn: Connection, *, states: Sequence[str], metadata: dict[str, str]) -> int:
    """Kill the sandboxes in `states` (all if empty) whose metadata has every pair of
    `metadata`; print one line with the count and return it. A sandbox that went away
    meanwhile is not counted."""
    from e2b import Sandbox

    from aenv.commands.common import call
    from aenv.commands.listing import STATES
    from aenv.commands.sandbox_api import listing

    if bad := [s for s in states if s not in STATES]:
        die(f"--state must be one of: {', '.join(STATES)}, not {bad[0]!r}", EXIT_USAGE)
    if not states:
        body = {"metadata": metadata} if metadata else {"all": True}
        done = call(conn, "POST", "/sandboxes/bulk/kill", body)
        killed = int(done["count"])
    else:
        with sdk_errors("rm"):
            ids = [w["sandboxID"] for w in listing(conn, states=states, metadata=metadata)]
            with ThreadPoolExecutor(PARALLEL) as pool:
                killed = sum(pool.map(lambda sid: Sandbox.kill(sid, **conn.sdk_opts()), ids))
    which = " and ".join(states or STATES)
    match = f" with {', '.join(f'{k}={v}' for k, v in metadata.items())}" if metadata else ""
    typer.echo(f"killed {killed} {which} sandbox{'' if killed == 1 else 'es'}{match}")
    return killed
