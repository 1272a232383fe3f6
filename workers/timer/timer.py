"""The TTL timer: keeps the clock of every sandbox that has not ended and, when a running
sandbox's `end_at` passes, sends its node the expiry command (pause by default, kill when
asked).

At scale it must not fold the log from its first event (years of ended sandboxes) nor keep
what ended: it starts from a `seed` — the read model's clocks of sandboxes that have not
ended and the stream sequence they were read at (`projections.queries.timer_start`, handed
in by the api role) — and folds only the log's tail after it, into `domain.sandbox.Clock`s
(a few fields each), forgetting a sandbox once it is being killed, killed or failed. With
no seed (a test, a tool) it folds from the stream's first event.

It also ends what a dead node left under way (`orphan_commands`): given the fleet's
heartbeats (`nodes`), a node silent for `AENV_NODE_LOST_AFTER_S` has its running sandboxes
killed in the log as lost, its creates failed and its resumes failed back to paused — what
the node's own restart would report, for a machine that does not come back. Not while no
node beats at all: then it is more likely this timer that is cut off.

Safe to run as several replicas: `expiry_command` derives the command id from (sandbox,
end_at, action), and `orphan_commands` from (sandbox, node, state), so JetStream's dedup
lets one copy through however many timers saw the expiry.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from uuid import UUID

from bus import AggregateKind, Bus, EventFeed, MessageContext, PublishError
from bus.decisions import execute
from bus.failpoints import failpoint
from bus.nodes import NodeBook, is_gone
from bus.steps import kill_in_log
from bus.supervised import supervise
from bus.tasks import cancel_and_wait
from domain import DomainError, Event, utcnow
from domain import sandbox as sb

__all__ = ["Seed", "Timer"]

log = logging.getLogger(__name__)

#: The clocks to start from and the stream sequence they reflect.
Seed = Callable[[], Awaitable[tuple[Iterable[sb.Clock], int]]]


class Timer:
    def __init__(
        self,
        bus: Bus,
        *,
        tick_s: float = 0.5,
        pause_supported: bool = True,
        seed: Seed | None = None,
        nodes: NodeBook | None = None,
        reap_every_s: float = 5.0,
        paused_retention_s: float | None = None,
    ) -> None:
        self.bus = bus
        #: paused sandboxes older than this are killed (None: kept for ever)
        self.paused_retention_s = paused_retention_s
        self._kept: list[tuple[datetime, str]] = []  # (paused_at, id) of paused sandboxes
        self.nodes = nodes
        self.reap_every_s = reap_every_s
        #: sandbox ids by the node their clock names
        self._by_node: dict[str, set[str]] = {}
        #: when this timer first missed a node's heartbeat (its entry expired, or never seen)
        self._missing: dict[str, float] = {}
        self.tick_s = tick_s
        self.pause_supported = pause_supported
        self.seed = seed
        #: sandboxes that have not ended, by id
        self.clocks: dict[str, sb.Clock] = {}
        self._due: list[tuple[datetime, str]] = []  # (end_at, id); stale entries skipped
        #: the expiry command last sent per sandbox (a clock that moved on sends anew)
        self._sent: dict[str, UUID] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        # a dead timer expires nothing and reaps nothing: restarted, or the role goes down
        self._task = supervise("ttl-timer", self.run)

    async def stop(self) -> None:
        self._stopping.set()
        # the loop also checks `_stopping` (a swallowed cancel: see bus.tasks)
        await cancel_and_wait(self._task)

    def _forget(self) -> None:
        """Drop the clocks folded so far (what was sent is kept: it is not sent twice)."""
        self.clocks.clear()
        self._due.clear()
        self._kept.clear()
        self._by_node.clear()

    def load(self, clocks: Iterable[sb.Clock]) -> None:
        for clock in clocks:
            self._keep(self.clocks.get(clock.sandbox_id), clock)

    def fold(self, sandbox_id: str, event: Event) -> None:
        before = self.clocks.get(sandbox_id)
        clock = sb.tick(before, event)
        if clock is None:
            self.clocks.pop(sandbox_id, None)
            self._sent.pop(sandbox_id, None)
            self._unindex(before)
            return
        self._keep(before, clock)

    def _unindex(self, clock: sb.Clock | None) -> None:
        if clock is not None and clock.node_id is not None:
            held = self._by_node.get(clock.node_id)
            if held is not None:
                held.discard(clock.sandbox_id)
                if not held:
                    del self._by_node[clock.node_id]

    def _keep(self, before: sb.Clock | None, clock: sb.Clock) -> None:
        self.clocks[clock.sandbox_id] = clock
        if before is None or before.node_id != clock.node_id:
            self._unindex(before)
            if clock.node_id is not None:
                self._by_node.setdefault(clock.node_id, set()).add(clock.sandbox_id)
        if clock.paused_at is not None and (before is None or before.paused_at != clock.paused_at):
            heapq.heappush(self._kept, (clock.paused_at, clock.sandbox_id))
        running = sb.SandboxStatus.RUNNING
        if clock.end_at is None or clock.status is not running:
            return
        if before is None or before.status is not running or before.end_at != clock.end_at:
            heapq.heappush(self._due, (clock.end_at, clock.sandbox_id))

    def expired(self, now: datetime) -> list[sb.PauseSandbox | sb.KillSandbox]:
        """Expiry commands due at `now`, each at most once per (sandbox, end_at)."""
        out: list[sb.PauseSandbox | sb.KillSandbox] = []
        while self._due and self._due[0][0] <= now:
            end_at, sid = heapq.heappop(self._due)
            clock = self.clocks.get(sid)
            if clock is None or clock.end_at != end_at:
                continue  # the TTL moved (extended, paused): a newer entry is in the heap
            cmd = sb.expiry_command(clock, now)
            if cmd is None or self._sent.get(sid) == cmd.command_id:
                continue
            if isinstance(cmd, sb.PauseSandbox) and not self.pause_supported:
                cmd = sb.KillSandbox(
                    sandbox_id=sid,
                    reason="timeout",
                    at=cmd.at,
                    command_id=sb.derived_command_id(str(cmd.command_id), "kill"),
                )
            self._sent[sid] = cmd.command_id
            out.append(cmd)
        return out

    def retained(self, now: datetime) -> list[sb.KillSandbox]:
        """Kills of sandboxes paused longer than the retention, each once per pause."""
        out: list[sb.KillSandbox] = []
        if self.paused_retention_s is None:
            return out
        horizon = now - timedelta(seconds=self.paused_retention_s)
        while self._kept and self._kept[0][0] <= horizon:
            paused_at, sid = heapq.heappop(self._kept)
            clock = self.clocks.get(sid)
            if clock is None or clock.paused_at != paused_at:
                continue  # resumed (or paused again) since
            cmd = sb.retention_command(clock, now, self.paused_retention_s)
            if cmd is None or self._sent.get(sid) == cmd.command_id:
                continue
            self._sent[sid] = cmd.command_id
            out.append(cmd)
        return out

    async def run(self) -> None:
        names = self.bus.names
        start = 1
        self._forget()  # a restart (`bus.supervised`) folds afresh from the seed
        if self.seed is not None:
            clocks, seq = await self.seed()
            self.load(clocks)
            start = seq + 1
            log.info(
                "timer: %d sandboxes from the read model, the log from %d on",
                len(self.clocks),
                start,
            )
        async with EventFeed(
            self.bus.js,
            self.bus.settings,
            names.events_of_kind(AggregateKind.SANDBOX),
            start_seq=start,
        ) as feed:
            reaped = time.monotonic()
            while not self._stopping.is_set():
                failpoint("timer.tick")  # a test's way to kill this task in a live API
                for rec in await feed.next_batch(timeout=self.tick_s):
                    self.fold(names.aggregate_id_of(rec.subject), rec.event)
                now = utcnow()
                for cmd in [*self.expired(now), *self.retained(now)]:
                    await self._send(cmd)
                if time.monotonic() - reaped >= self.reap_every_s:
                    reaped = time.monotonic()
                    await self.reap(time.time())

    async def _send(self, cmd: sb.PauseSandbox | sb.KillSandbox) -> None:
        clock = self.clocks[cmd.sandbox_id]
        try:
            if isinstance(cmd, sb.KillSandbox) and await self._node_gone(clock.node_id):
                # its queue has no reader: killed in the log, as the API does a client's
                why = f"node {clock.node_id} is gone; killed in the log"
                await kill_in_log(
                    self.bus, cmd, clock.node_id, why=why, actor="timer", moot_ok=True
                )
            elif clock.node_id:
                await self.bus.commands.to_node(clock.node_id, cmd)
            else:
                await self.bus.commands.to_placement(cmd)
            log.info(
                "timer: %s %s (%s)", type(cmd).__name__, cmd.sandbox_id, getattr(cmd, "reason", "")
            )
        except PublishError as e:
            log.warning("timer: could not send %s: %s", cmd.command_id, e)
            self._sent.pop(cmd.sandbox_id, None)
            if isinstance(cmd, sb.KillSandbox) and cmd.reason == "retention":
                assert clock.paused_at is not None
                heapq.heappush(self._kept, (clock.paused_at, cmd.sandbox_id))
            else:
                heapq.heappush(self._due, (cmd.at, cmd.sandbox_id))

    async def _node_gone(self, node_id: str | None) -> bool:
        if node_id is None or self.nodes is None:
            return False
        beats = self.nodes.current()
        return beats is not None and is_gone(beats.get(node_id), time.time())

    def lost_nodes(self, now: float) -> list[str]:
        """Nodes that clocks name and that have been silent for `node_lost_after_s` — none
        when no node beats at all, or before this timer has heard the bucket."""
        beats = self.nodes.current() if self.nodes is not None else None
        if beats is None or not any(not is_gone(b, now) for b in beats.values()):
            return []
        lost = []
        for node in self._by_node:
            beat = beats.get(node)
            if beat is not None and not is_gone(beat, now):
                self._missing.pop(node, None)
                continue
            silent_since = beat.at if beat is not None else self._missing.setdefault(node, now)
            if now - silent_since >= self.bus.settings.node_lost_after_s:
                lost.append(node)
        return lost

    async def reap(self, now: float) -> None:
        for node in self.lost_nodes(now):
            why = (
                f"node {node} is gone (no heartbeat for "
                f"{self.bus.settings.node_lost_after_s:.0f} s)"
            )
            for clock in self.on_node(node):
                await self._end_orphan(clock, node, why)

    def on_node(self, node: str) -> list[sb.Clock]:
        """The clocks of the sandboxes on `node` (what its loss ends): a resuming one is on
        the node that took its resume, once the request names it (`SandboxResumeRequested`)."""
        return [self.clocks[sid] for sid in sorted(self._by_node.get(node, ()))]

    async def _end_orphan(self, clock: sb.Clock, node: str, why: str) -> None:
        cmds = sb.orphan_commands(clock, why)
        try:
            match cmds:
                case [sb.KillSandbox() as kill, sb.CompleteKill() as done]:
                    # a node that was only cut off drops the VM it still runs when back
                    await kill_in_log(
                        self.bus, kill, node, why=why, actor="timer", done_id=done.command_id
                    )
                case _:
                    for cmd in cmds:
                        await execute(self.bus.sandboxes, cmd, MessageContext(actor="timer"))
        except (DomainError, PublishError) as e:  # moved on meanwhile, or later
            log.info("timer: ending %s on lost node %s: %s", clock.sandbox_id, node, e)
            return
        if cmds:
            log.warning(
                "timer: ended %s (%s) on lost node %s", clock.sandbox_id, clock.status.value, node
            )
