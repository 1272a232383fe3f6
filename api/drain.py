"""A node's drain: cordon it, pause every sandbox it runs (memory kept) and report how
many of its sandboxes are paused with their capture in the snapshot repository — durable,
so that any node can resume them (`api.resume`: a cordoned node's durable pauses resume
elsewhere) and the node can be stopped, upgraded or lost without losing one.

One drain step (`step`) is idempotent and holds no state of its own: it looks at the
node's sandboxes in the log, sends a pause to each that runs (its command id derived from
the sandbox's version, so a repeated step while it pauses sends nothing new, and a sandbox
resumed onto the node since is paused again), and answers the progress. `aenv node drain`
repeats it until the node holds nothing that is not paused and durable. The node's warm
VMs go with the cordon itself (`workers.node.cordon`). The pauses' uploads are the
snapshot workers' as for any pause (`SnapshotUploaded` marks a capture durable).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from api.context import ApiContext
from bus.steps import drain_pauses
from domain.sandbox import SandboxStatus
from projections import queries

__all__ = ["DrainProgress", "Held", "progress", "step", "to_pause"]

#: How many of the sandboxes not yet durable an answer names (the count says the rest).
_NAMED = 20


@dataclass(frozen=True)
class Held:
    """One sandbox on the draining node, as the drain sees it."""

    sandbox_id: str
    status: SandboxStatus
    #: paused, and that capture is in the snapshot repository
    durable: bool

    @property
    def done(self) -> bool:
        return self.status is SandboxStatus.PAUSED and self.durable


@dataclass(frozen=True)
class DrainProgress:
    node_id: str
    #: sandboxes on the node (not killed or failed), and how many are paused and durable
    total: int
    durable: int
    #: of the rest: still running (a pause is on its way), and paused but not uploaded yet
    running: int
    uploading: int
    #: some of those not done yet, by id
    waiting: tuple[str, ...]

    @property
    def done(self) -> bool:
        return self.durable == self.total

    def wire(self) -> dict[str, object]:
        return {
            "nodeID": self.node_id,
            "sandboxes": self.total,
            "durable": self.durable,
            "running": self.running,
            "uploading": self.uploading,
            "waiting": list(self.waiting),
            "done": self.done,
        }


def to_pause(held: Iterable[Held]) -> list[str]:
    """The sandboxes a drain pauses now: those running. One being created, resumed,
    snapshotted or forked is paused by a later step, once it runs."""
    return [h.sandbox_id for h in held if h.status is SandboxStatus.RUNNING]


def progress(node_id: str, held: Iterable[Held]) -> DrainProgress:
    listed = list(held)
    rest = [h for h in listed if not h.done]
    return DrainProgress(
        node_id=node_id,
        total=len(listed),
        durable=len(listed) - len(rest),
        running=sum(h.status is not SandboxStatus.PAUSED for h in rest),
        uploading=sum(h.status is SandboxStatus.PAUSED for h in rest),
        waiting=tuple(h.sandbox_id for h in rest[:_NAMED]),
    )


async def step(ctx: ApiContext, node_id: str, *, actor: str | None) -> DrainProgress:
    """Pause what runs on `node_id` (cordoned by the caller) and say how far it is."""
    await ctx.fenced_to_tail()  # every sandbox placed on it so far is in the read model
    async with ctx.engine.connect() as conn:
        ids = await queries.node_sandbox_ids(conn, node_id)
    held: list[Held] = []
    revisions: dict[str, int] = {}
    for sid in ids:
        state, version = await ctx.bus.sandboxes.load(sid)  # the log: the read model lags
        if state is None or state.node_id != node_id:
            continue  # resumed elsewhere since
        if state.status in (SandboxStatus.KILLED, SandboxStatus.FAILED):
            continue
        held.append(Held(sid, state.status, state.resumable_anywhere))
        revisions[sid] = version.revision
    running = [(sid, revisions[sid]) for sid in to_pause(held)]
    await drain_pauses(ctx.bus, node_id, running, tag="drain", actor=actor)
    return progress(node_id, held)
