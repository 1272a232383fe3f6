"""After a node restart: what its journal says it hosted, against what the log says.

VMs die with the node process, so a sandbox that was running here lost its VM (the log
hears so: killed, "node restarted; VM lost"); a paused one still has its capture on this
disk and is taken back, resumable. One killed while the node was away, or resumed on
another node from the repository, leaves only a stale copy here, which goes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from bus.store import SandboxStore
from domain import sandbox as sb
from domain.sandbox import SandboxStatus as S
from workers.node.journal import Journal
from workers.node.ports import GuestConfig, Host

__all__ = ["reconcile"]

log = logging.getLogger(__name__)

Kill = Callable[[sb.KillSandbox, str], Awaitable[None]]


async def reconcile(
    store: SandboxStore, host: Host, journal: Journal, node_id: str,
    guest: Callable[[sb.Sandbox], GuestConfig], kill: Kill,
) -> None:  # fmt: skip
    for entry in journal.entries():
        sid = entry.sandbox_id
        if host.runs(sid) or host.holds_paused(sid):
            continue
        state, _ = await store.load(sid)
        home = state.node_id if state is not None else None
        moved = home not in (None, node_id)
        if state is None or state.status in (S.KILLED, S.FAILED) or moved:
            if moved:
                log.info("sandbox %s moved to node %s; dropping the local copy", sid, home)
            if entry.paused_snapshot:
                host.drop_capture(entry.paused_snapshot)
            journal.remove(sid)
            continue
        if state.status is S.PAUSED and entry.paused_snapshot and host.adopt_paused(
            sid, entry.template_id, entry.paused_snapshot, guest(state)
        ):
            continue  # an upload cut short is delivered to the snapshot worker again
        cid = sb.derived_command_id(sid, "reconcile", str(state.requested_at))
        await kill(sb.KillSandbox(sandbox_id=sid, command_id=cid), "node restarted; VM lost")
