"""The node's drain on SIGTERM (`AENV_STOP_DRAIN=pause`): before the role stops, it
cordons itself, pauses every sandbox it runs (memory kept) and waits until each capture is
durable in the snapshot repository, so that a restart, an upgrade or a node taken away
loses no sandbox: their resumes land on other nodes (a cordoned node's durable pauses
resume elsewhere), or here once it is back and uncordoned.

It is `aenv node drain` done by the node itself: the cordon is the operator's event
(`CordonNode`, reason `stop`, appended through the bus), and each pause a command to this
node's own consumer with an id derived from the sandbox's version (a repeated round sends
nothing new). The node's worker and snapshot uploader run on meanwhile — they stop only
once this returns. Bounded by `AENV_STOP_DRAIN_S`: what is not durable by then stays
paused here (or running) and the role exits as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bus import Bus, MessageContext
from bus.decisions import execute
from bus.steps import drain_pauses
from domain import node as nd
from domain import sandbox as sb
from domain.sandbox import SandboxStatus

__all__ = ["ROUND_S", "StopDrain", "Tally", "tally"]

log = logging.getLogger(__name__)

#: How often the drain looks at its sandboxes in the log (and pauses any that runs again).
ROUND_S = 1.0
#: Sandboxes in these states are done with: nothing of theirs is left to lose.
_ENDED = (SandboxStatus.KILLED, SandboxStatus.FAILED)


@dataclass(frozen=True)
class Tally:
    """Where the drain is: of `total` sandboxes it holds, `done` are paused and durable
    (or ended, or moved away); `to_pause` run here and get a pause now."""

    total: int
    done: int
    to_pause: tuple[str, ...]

    @property
    def finished(self) -> bool:
        return self.done == self.total


def tally(node_id: str, states: Iterable[tuple[str, sb.Sandbox | None]], *, durable: bool) -> Tally:
    """Pure: what the log says of the sandboxes this node held when it was asked to stop.
    `durable`: the node has a repository (without one a pause stays on this node's disk,
    and paused is all a drain can reach)."""
    listed = list(states)
    done, pause = 0, []
    for sid, state in listed:
        if _done_with(node_id, state, durable=durable):
            done += 1
        elif state is not None and state.status is SandboxStatus.RUNNING:
            pause.append(sid)
    return Tally(total=len(listed), done=done, to_pause=tuple(pause))


def _done_with(node_id: str, state: sb.Sandbox | None, *, durable: bool) -> bool:
    if state is None or state.node_id != node_id or state.status in _ENDED:
        return True  # never here, resumed elsewhere since, or nothing left to keep
    return state.status is SandboxStatus.PAUSED and (state.resumable_anywhere or not durable)


class StopDrain:
    """One node's drain on stop: `run` returns once every sandbox it held is paused and
    durable, or once `grace_s` has passed."""

    def __init__(
        self,
        bus: Bus,
        node_id: str,
        running_ids: Callable[[], list[str]],
        *,
        durable: bool,
        grace_s: float,
        say: Callable[[str], None],
    ) -> None:
        self.bus, self.node_id, self.running_ids = bus, node_id, running_ids
        self.durable, self.grace_s, self.say = durable, grace_s, say

    async def run(self) -> Tally | None:
        """Never raises: a drain that cannot reach the bus (NATS gone with the host) leaves
        the stop as it was without one. None: it failed or hung past its grace."""
        try:
            # each round's bus calls have their own timeouts; this bounds a hung one too
            return await asyncio.wait_for(self._drain(), self.grace_s + 2 * ROUND_S)
        except Exception as e:  # TimeoutError included
            log.error("stop drain failed, stopping without it: %r", e)
            return None

    async def _drain(self) -> Tally:
        started = time.monotonic()
        await execute(
            self.bus.node_orders,
            nd.CordonNode(node_id=self.node_id, reason="stop"),
            MessageContext(actor=f"node:{self.node_id}"),
        )
        held = sorted(self.running_ids())
        self.say(
            f"stop drain: node {self.node_id} cordoned; pausing {len(held)} sandboxes into the "
            f"repository (at most {self.grace_s:.0f} s)"
        )
        last: Tally | None = None
        while True:
            now = await self._round(held)
            if now != last:
                self.say(f"stop drain: {now.done} of {now.total} sandboxes paused and durable")
                last = now
            elapsed = time.monotonic() - started
            if now.finished:
                self.say(f"stop drain: done in {elapsed:.1f} s")
                return now
            if elapsed > self.grace_s:
                log.error(
                    "stop drain: %d of %d sandboxes not durable after %.0f s (AENV_STOP_DRAIN_S);"
                    " stopping anyway",
                    now.total - now.done,
                    now.total,
                    self.grace_s,
                )
                return now
            await asyncio.sleep(ROUND_S)

    async def _round(self, held: list[str]) -> Tally:
        states: list[tuple[str, sb.Sandbox | None]] = []
        versions: dict[str, int] = {}
        for sid in held:
            state, version = await self.bus.sandboxes.load(sid)
            states.append((sid, state))
            versions[sid] = version.revision
        now = tally(self.node_id, states, durable=self.durable)
        running = [(sid, versions[sid]) for sid in now.to_pause]
        actor = f"node:{self.node_id}"
        await drain_pauses(self.bus, self.node_id, running, tag="stop-drain", actor=actor)
        return now
