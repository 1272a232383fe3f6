"""Creates another node took: the request names the node that takes it, so a create
redelivered here while another node still works on it (its heartbeats lost to a NATS
outage) finds it taken. Its outcome is that node's; it is watched only so that a create
whose node died with it is answered — failed here once that node is gone, never left
`creating`."""

from __future__ import annotations

import asyncio
import logging

from bus import Bus, MessageContext
from bus.decisions import execute
from bus.nodes import NodeBook
from domain import sandbox as sb
from domain.sandbox import SandboxStatus as S
from workers.node.completions import completion_id

__all__ = ["TakenCreates"]

log = logging.getLogger(__name__)

#: A create another node took is watched this long (rounds times the poll) for its end or that
#: node's death (3 missed heartbeats: 15 s by default).
_TAKEN_POLL_S = 1.0
_TAKEN_WAIT_ROUNDS = 30


class TakenCreates:
    def __init__(self, bus: Bus, node_id: str) -> None:
        self.bus = bus
        self.node_id = node_id
        #: the fleet's heartbeats, opened when a create turns out to be another node's
        self._nodes: NodeBook | None = None

    async def watch(self, cmd: sb.CreateSandbox, state: sb.Sandbox, ctx: MessageContext) -> None:
        """Waited for a while (the message kept alive) for the create's end or its node's."""
        owner = state.node_id
        if owner is None:  # an API withdrew it, and records its failure itself
            return
        for _ in range(_TAKEN_WAIT_ROUNDS):
            if await self._gone(owner):
                done = sb.CompleteCreate(
                    sandbox_id=cmd.sandbox_id,
                    node_id=self.node_id,
                    error=f"node {owner}, which took it, is gone",
                    command_id=completion_id(cmd, "orphaned"),
                )
                await execute(self.bus.sandboxes, done, ctx)
                return
            await asyncio.sleep(_TAKEN_POLL_S)
            fresh, _ = await self.bus.sandboxes.load(cmd.sandbox_id)
            if fresh is None or fresh.status is not S.CREATING:
                return
        log.info("create of %s is still on node %s: leaving it there", cmd.sandbox_id, owner)

    async def _gone(self, node_id: str) -> bool:
        if self._nodes is None:
            self._nodes = await NodeBook.open(self.bus.js, self.bus.names.nodes_bucket)
        return await self._nodes.gone(node_id)
