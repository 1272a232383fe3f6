"""After a node restart: what its journal says it hosted, against what the log says.

VMs die with the node process, so a sandbox that was running here lost its VM (the log
hears so: killed by the node, "node restarted; VM lost"); a paused one still has its
capture on this disk and is taken back, resumable — also when the node died in the middle
of its pause (after the capture) or of its resume: the command, delivered again, finishes
either. One killed while the node was away, or resumed on another node from the
repository, leaves only a stale copy here, which goes.
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

#: a sandbox in these states whose capture is on disk is paused in all but name: a pause that
#: finished its capture before the node died, or a resume that had not finished
KEEPS_CAPTURE = frozenset({S.PAUSED, S.PAUSING, S.RESUMING})


async def reconcile(
    store: SandboxStore,
    host: Host,
    journal: Journal,
    node_id: str,
    guest: Callable[[sb.Sandbox], GuestConfig],
    kill: Kill,
) -> None:
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
        # The log names the capture too: the journal says "running" once the resumed VM
        # is up, but until its resume is recorded the capture stays whole on this disk
        # (`SandboxHost.resume_recorded`) — a node killed in between still holds it.
        capture = entry.paused_snapshot or state.paused_snapshot_id
        if (
            capture
            and state.status in KEEPS_CAPTURE
            and host.adopt_paused(
                sid,
                entry.template_id,
                capture,
                guest(state),
                durable=state.durable_snapshot_id == capture,
            )
        ):
            # an upload cut short is delivered to the snapshot worker again; a pause or a
            # resume cut short, its command again (the capture answers either)
            continue
        cid = sb.derived_command_id(sid, "reconcile", str(state.requested_at))
        why = "node restarted; VM lost"
        if capture and state.status in KEEPS_CAPTURE:
            why = (
                "node restarted; the paused capture is lost (missing, or a resume cut "
                "short had run the guest from it before it reached the repository)"
            )
        await kill(sb.KillSandbox(sandbox_id=sid, command_id=cid), why)
