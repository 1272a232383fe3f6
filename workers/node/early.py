"""Early starts: a create's or resume's VM starts while its decision is being appended.

The round trip to the log is off the restore's path: the VM's start runs first, up to its
first wait, and the decision's CPU work (decide, encode, publish) then overlaps the restore
instead of delaying its beginning. The decision is still made first in the log's order: a
create the log refuses, or a resume of a sandbox killed meanwhile, has its early VM removed.
Only a sandbox this node is doing nothing with starts early (a redelivery of a command under
way or done here takes the plain path), so undoing one never touches another's VM.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from bus.store import SandboxStore
from domain import DomainError
from domain import sandbox as sb
from workers.node.journal import Journal
from workers.node.ports import Host

__all__ = ["EarlyStart", "EarlyStarts", "Started", "Starter"]

#: (error or None, whether this call started the VM)
Started = tuple[str | None, bool]
EarlyStart = asyncio.Task[Started]
#: what starts a VM early: the coroutine the task runs
Starter = Callable[[], Coroutine[Any, Any, Started]]


class EarlyStarts:
    def __init__(self, host: Host) -> None:
        self.host = host
        self._starting: set[str] = set()

    @staticmethod
    def creates(store: SandboxStore, cmd: sb.CreateSandbox) -> bool:
        """Whether the create will most likely be decided as new: the node has never seen
        the sandbox (one it knows is a duplicate) and the command itself is valid."""
        if store.cached(cmd.sandbox_id) is not None:
            return False
        try:
            return bool(sb.decide(None, cmd))
        except DomainError:
            return False

    @staticmethod
    def resumes(store: SandboxStore, cmd: sb.ResumeSandbox) -> bool:
        """Whether the log, as this node last saw it, would resume the sandbox (the guess an
        early start rests on; a wrong one costs a VM that is killed or kept, never state)."""
        known = store.cached(cmd.sandbox_id)
        if known is None or known[0] is None or known[0].status is not sb.SandboxStatus.PAUSED:
            return False
        try:
            return any(isinstance(e, sb.SandboxResumeRequested) for e in sb.decide(known[0], cmd))
        except DomainError:
            return False

    async def start(self, sandbox_id: str, run: Starter) -> EarlyStart | None:
        sid = sandbox_id
        if self.host.runs(sid) or sid in self._starting or self.host.lock(sid).locked():
            return None
        self._starting.add(sid)
        task = asyncio.create_task(run(), name=f"early:{sid}")
        task.add_done_callback(lambda _: self._starting.discard(sid))
        await asyncio.sleep(0)
        return task

    async def undo(self, sandbox_id: str, early: EarlyStart | None, journal: Journal) -> None:
        """The log refused the create or resume (or could not be written, for a create):
        the VM started early goes."""
        if early is None:
            return
        error, started = await early
        if error is None and started:
            async with self.host.lock(sandbox_id):
                await self.host.kill(sandbox_id)
                journal.remove(sandbox_id)
