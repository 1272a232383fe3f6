"""The TTL timer: folds sandbox events and, when a running sandbox's `end_at` passes, sends
its node the expiry command (pause by default, kill when asked).

Stateless across restarts: it refolds the log on start. Safe to run as several replicas:
`expiry_command` derives the command id from (sandbox, end_at, action), so JetStream's
dedup lets one copy through however many timers saw the expiry.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from datetime import datetime

from bus import AggregateKind, Bus, EventFeed, PublishError
from bus.tasks import cancel_and_wait
from domain import CommandRejected, CorruptHistory, utcnow
from domain import sandbox as sb

log = logging.getLogger(__name__)


class Timer:
    def __init__(self, bus: Bus, *, tick_s: float = 0.5, pause_supported: bool = True) -> None:
        self.bus = bus
        self.tick_s = tick_s
        self.pause_supported = pause_supported
        self.states: dict[str, sb.Sandbox] = {}
        self._due: list[tuple[datetime, str]] = []  # (end_at, id); stale entries skipped
        self._sent: set[object] = set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="ttl-timer")

    async def stop(self) -> None:
        self._stopping.set()
        # the loop also checks `_stopping` (a swallowed cancel: see bus.tasks)
        await cancel_and_wait(self._task)

    def fold(self, sandbox_id: str, event: sb.SandboxEvent | CommandRejected) -> None:
        if isinstance(event, CommandRejected):
            return
        try:
            state = sb.evolve(self.states.get(sandbox_id), event)
        except CorruptHistory as e:
            log.error("timer: skipping %s: %s", sandbox_id, e)
            return
        if state is None:
            self.states.pop(sandbox_id, None)
            return
        self.states[sandbox_id] = state
        if state.end_at is not None and state.status is sb.SandboxStatus.RUNNING:
            heapq.heappush(self._due, (state.end_at, sandbox_id))

    def expired(self, now: datetime) -> list[sb.PauseSandbox | sb.KillSandbox]:
        """Expiry commands due at `now`, each at most once per (sandbox, end_at)."""
        out: list[sb.PauseSandbox | sb.KillSandbox] = []
        while self._due and self._due[0][0] <= now:
            end_at, sid = heapq.heappop(self._due)
            state = self.states.get(sid)
            if state is None or state.end_at != end_at:
                continue  # the TTL moved (extended, paused): a newer entry is in the heap
            cmd = sb.expiry_command(state, now)
            if cmd is None or cmd.command_id in self._sent:
                continue
            if isinstance(cmd, sb.PauseSandbox) and not self.pause_supported:
                cmd = sb.KillSandbox(
                    sandbox_id=sid,
                    reason="timeout",
                    at=cmd.at,
                    command_id=sb.derived_command_id(str(cmd.command_id), "kill"),
                )
            self._sent.add(cmd.command_id)
            out.append(cmd)
        return out

    async def run(self) -> None:
        names = self.bus.names
        async with EventFeed(
            self.bus.js, self.bus.settings, names.events_of_kind(AggregateKind.SANDBOX)
        ) as feed:
            while not self._stopping.is_set():
                for rec in await feed.next_batch(timeout=self.tick_s):
                    self.fold(names.aggregate_id_of(rec.subject), rec.event)  # type: ignore[arg-type]
                for cmd in self.expired(utcnow()):
                    node = self.states[cmd.sandbox_id].node_id
                    try:
                        if node:
                            await self.bus.commands.to_node(node, cmd)
                        else:
                            await self.bus.commands.to_placement(cmd)
                        log.info("timer: %s %s", type(cmd).__name__, cmd.sandbox_id)
                    except PublishError as e:
                        log.warning("timer: could not send %s: %s", cmd.command_id, e)
                        self._sent.discard(cmd.command_id)
                        heapq.heappush(self._due, (cmd.at, cmd.sandbox_id))
