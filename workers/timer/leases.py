"""The lease timer: expires leases not renewed in time and sweeps the sandboxes of every
lease that expired or was ended (`domain/lease`, issue 32).

It keeps nothing in memory that a restart would lose: each tick it asks the read model
(callables the api role hands in) for the active leases whose deadline passed, decides
their expiry on the log (`ExpireLease`: a renewal that came first wins, and several timers
deciding it append one event), and for every lease that ended within the last
`SWEEP_AFTER_END_S` sends its action (kill, or pause for an expiry that said so) to each
of its sandboxes the read model shows — again next tick, so that a create that checked the
lease just before it ended is caught once it lands. The commands' ids derive from the
sandboxes' revisions (`bus.bulk`): a sweep repeated while a kill is on its way publishes
the same ids, which JetStream keeps once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from bus import Bus, MessageContext, PublishError
from bus.bulk import Member, send_ends
from bus.decisions import execute
from bus.nodes import NodeBook, is_gone
from bus.supervised import supervise
from bus.tasks import cancel_and_wait
from domain import DomainError, utcnow
from domain import lease as ls
from domain import sandbox as sb

__all__ = ["LeaseTimer", "expire_command", "sweep_tag"]

log = logging.getLogger(__name__)

Leases = Callable[[datetime], Awaitable[list[ls.Lease]]]
Members = Callable[[str, str], Awaitable[list[Member]]]


def expire_command(lease: ls.Lease, now: datetime) -> ls.ExpireLease:
    """The expiry of `lease` as every timer replica builds it: one id per deadline."""
    command_id = sb.derived_command_id("lease-expire", lease.lease_id, lease.expires_at.isoformat())
    return ls.ExpireLease(lease_id=lease.lease_id, at=now, command_id=command_id)


def sweep_tag(lease: ls.Lease) -> str:
    """The tag of a lease's sweep commands: its end, so an expiry's pauses and a later
    end's kills of the same sandbox are different commands."""
    assert lease.ended_at is not None
    kind = "lease-exp" if lease.status is ls.LeaseStatus.EXPIRED else "lease-end"
    return f"{kind}:{lease.lease_id}:{lease.ended_at.isoformat()}"


class LeaseTimer:
    def __init__(
        self,
        bus: Bus,
        *,
        due: Leases,
        swept: Leases,
        members: Members,
        nodes: NodeBook | None = None,
        tick_s: float = 1.0,
        on_expired: Callable[[ls.Lease], None] | None = None,
    ) -> None:
        self.bus = bus
        self.due = due
        self.swept = swept
        self.members = members
        self.nodes = nodes
        self.tick_s = tick_s
        #: told of each expiry this timer decided (a metric): once per lease, whichever
        #: replica's decision was appended
        self.on_expired = on_expired
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        self._task = supervise("lease-timer", self.run)

    async def stop(self) -> None:
        self._stopping.set()
        await cancel_and_wait(self._task)

    async def run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                await self.tick(utcnow())
            except Exception as e:  # the read model or the bus away: every step is idempotent,
                log.warning("lease timer: tick failed, retried: %r", e)  # the next tick redoes it
            rest = self.tick_s - (time.monotonic() - started)
            if rest > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), rest)

    async def tick(self, now: datetime) -> None:
        ended = {}
        for lease in await self.due(now):
            try:
                decided = await execute(
                    self.bus.leases, expire_command(lease, now), MessageContext(actor="timer")
                )
            except (DomainError, PublishError) as e:
                log.info("lease timer: expiring %s: %s", lease.lease_id, e)
                continue
            if decided.events and decided.state is not None:
                log.info("lease timer: lease %s expired", lease.lease_id)
                if self.on_expired is not None:
                    self.on_expired(decided.state)
                ended[lease.lease_id] = decided.state
        for lease in await self.swept(now - timedelta(seconds=ls.SWEEP_AFTER_END_S)):
            ended.setdefault(lease.lease_id, lease)
        for lease in ended.values():
            await self.sweep(lease)

    async def sweep(self, lease: ls.Lease) -> list[str]:
        action = ls.member_action(lease)
        if action is None:
            return []
        members = await self.members(lease.team_id, lease.lease_id)
        try:
            sent = await send_ends(
                self.bus, members, action, tag=sweep_tag(lease), actor="timer", gone=self._gone
            )
        except PublishError as e:  # the next tick sends again
            log.warning("lease timer: sweeping %s: %s", lease.lease_id, e)
            return []
        if sent:
            log.info("lease timer: %s %d sandboxes of lease %s", action, len(sent), lease.lease_id)
        return sent

    async def _gone(self, node_id: str) -> bool:
        beats = self.nodes.current() if self.nodes is not None else None
        return beats is not None and is_gone(beats.get(node_id), time.time())
