"""After a node restart: what its journal says it hosted, against what the log says.

VMs die with the node process, so a sandbox that was running here lost its VM (the log
hears so: killed by the node, "node restarted; VM lost"); a paused one still has its
capture on this disk and is taken back, resumable — also when the node died in the middle
of its pause (after the capture) or of its resume: the command, delivered again, finishes
either. A sandbox whose resume the log holds but whose capture the node had not released
yet (the journal still names it: `Journal.settle`) is rolled back to it — paused again on
that capture, by a pause with reason `rollback` — instead of killed: its guest ran for
moments, and nothing of it outlived the node but the capture. One killed while the node
was away, or resumed on another node from the repository, leaves only a stale copy here,
which goes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from bus.store import SandboxStore
from domain import DomainError
from domain import sandbox as sb
from domain.sandbox import SandboxStatus as S
from workers.node.journal import Journal
from workers.node.ports import GuestConfig, Host

__all__ = ["reconcile"]

log = logging.getLogger(__name__)

Kill = Callable[[sb.KillSandbox, str], Awaitable[None]]
#: pause a sandbox whose VM is gone on the capture this node holds for it again
RollBack = Callable[[sb.PauseSandbox], Awaitable[None]]

#: a sandbox in these states whose capture is on disk is paused in all but name: a pause that
#: finished its capture before the node died, or a resume that had not finished
KEEPS_CAPTURE = frozenset({S.PAUSED, S.PAUSING, S.RESUMING})
#: a sandbox in these states whose resume ran from a capture still named in the journal is
#: rolled back to it (a pause requested meanwhile finishes on it)
ROLLS_BACK = frozenset({S.RUNNING, S.PAUSING})


async def reconcile(
    store: SandboxStore,
    host: Host,
    journal: Journal,
    node_id: str,
    guest: Callable[[sb.Sandbox], GuestConfig],
    kill: Kill,
    roll_back: RollBack,
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
        # First a resume the log holds (or a roll-back whose pause it holds in part): the
        # journal still names its capture, so the node had not released it.
        if (
            entry.resumed_from
            and state.status in ROLLS_BACK
            and state.node_id == node_id
            and host.adopt_paused(
                sid,
                entry.template_id,
                entry.resumed_from,
                guest(state),
                durable=state.durable_snapshot_id == entry.resumed_from,
            )
        ):
            log.warning(
                "sandbox %s: its resume was recorded but the node restarted before it "
                "released capture %s; rolled back to it (paused)",
                sid,
                entry.resumed_from,
            )
            # paused on it as far as the node knows; still named as the resume's until the
            # pause is in the log (a restart before that rolls back again)
            journal.add(sid, entry.template_id, entry.resumed_from, resumed_from=entry.resumed_from)
            # one id per resume rolled back (its `end_at` is its own): a second roll-back to
            # the same capture, after another resume from it, is a new pause
            cid = sb.derived_command_id(sid, "roll-back", entry.resumed_from, str(state.end_at))
            try:
                await roll_back(sb.PauseSandbox(sandbox_id=sid, command_id=cid, reason="rollback"))
                continue
            except DomainError as e:  # (the log moved on meanwhile: a kill, say)
                log.warning("sandbox %s was not rolled back: %s", sid, e)
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
