"""Whether an operator cordoned this node (`domain/node`, `aenv node cordon`), as the node
follows it: a cordoned node pulls no placed creates or resumes, keeps no warm VMs, and
says so in its heartbeat (the API then places nothing on it and waits for that word before
it answers a cordon).

The cordon is in the log, not in the node: it is read before the node pulls anything (a
node restarted while cordoned never takes a create), then looked at again every
`POLL_S` — one round trip to JetStream while nothing changed (`EventStore.load` keeps its
fold), cheap next to the heartbeat it feeds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from bus import Bus, Delivery, RetryableError
from bus.tasks import cancel_and_wait
from domain import node as nd
from domain import sandbox as sb

__all__ = ["POLL_S", "CordonWatch", "refuses"]

log = logging.getLogger(__name__)

#: How often the node looks at its cordon. A cordon is answered once the heartbeat shows
#: it, so this bounds (with the beat) how long `aenv node cordon` takes.
POLL_S = 1.0


def refuses(cordoned: bool, *, placed: bool, forked: bool) -> bool:
    """Whether a cordoned node passes a command on: a create or resume any node may take
    (`placed`) goes to another. A fork's children start beside their parent, and a command
    addressed to this node (its own paused sandbox, a kill) is still its work."""
    return cordoned and placed and not forked


class CordonWatch:
    """This node's cordon, followed from the log. `changed` is set on each change: the
    heartbeat beats at once, so the API learns it without waiting a period."""

    def __init__(self, bus: Bus, node_id: str) -> None:
        self.bus = bus
        self.node_id = node_id
        self.cordoned = False
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def pass_on(self, d: Delivery) -> None:
        """Raise for a command a cordoned node passes on (pulled just before the cordon:
        another node takes it; this one pulls no more)."""
        cmd = d.command
        forked = isinstance(cmd, sb.CreateSandbox) and cmd.beside_parent
        if refuses(self.cordoned, placed=self.bus.names.is_placed(d.subject), forked=forked):
            raise RetryableError(f"node {self.node_id} is cordoned", delay_s=0)

    def spare(self, free_mib: Callable[[], int]) -> Callable[[], int]:
        """The memory the warm pool may use: none on a cordoned node (its warm VMs go
        within the pool's tick, `warmsize.targets`), else `free_mib`."""
        return lambda: 0 if self.cordoned else free_mib()

    async def refresh(self) -> bool:
        """Read the cordon from the log now; returns it."""
        state, _ = await self.bus.node_orders.load(self.node_id)
        now = nd.is_cordoned(state)
        if now != self.cordoned:
            self.cordoned = now
            log.warning(
                "node %s is %s",
                self.node_id,
                "cordoned: it takes no new sandboxes"
                if now
                else "uncordoned: it takes new sandboxes again",
            )
            self.changed.set()
        return now

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="cordon-watch")

    async def stop(self) -> None:
        # (its loop waits on nats-py requests, which can swallow a single cancel)
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the bus reconnecting: the last word stands meanwhile
                log.warning("could not read node %s's cordon: %s", self.node_id, e)
