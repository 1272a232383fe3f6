"""A pool of ready network slots, kept filled in the background.

Creating a slot costs ~50 ms here; a create or restore must not pay it, so the pool keeps
`target` slots warm and hands one out in O(1). Refills and the teardown of released slots
are housekeeping: they wait for `settled` (the runtime's: no restore in flight) and run at
the lowest priority. Slot indices are claimed with flocks, so
several node processes on one host (or a test next to a dev stack) never collide.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable

from workers.node.foreground import in_background
from workers.node.net.addressing import DEFAULT_SLOT_CIDR, slot_address, slot_capacity
from workers.node.net.errors import NetworkError
from workers.node.net.firewall import EgressPolicy
from workers.node.net.slot import (
    NetworkSlot,
    create_slot,
    destroy_slot,
    host_addresses,
    routed_overlap,
    sweep_stale,
    try_lock,
    update_policy,
)

log = logging.getLogger(__name__)

FILL_PARALLEL = 4  # slot builds in flight at once (netlink + one iptables-restore exec each)
#: Refills wait for this much quiet after the last acquire (at most REFILL_MAX_WAIT_S): a
#: burst (a 16-way fork) should not share the CPU with rebuilding the slots it just took.
REFILL_QUIET_S = 0.3
REFILL_MAX_WAIT_S = 1.5


class SlotPool:
    """Hands out network slots; call `start()` once and `close()` at shutdown."""

    def __init__(
        self,
        *,
        target: int = 4,
        cidr: str = DEFAULT_SLOT_CIDR,
        prefix: str = "aenv",
        settled: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._target = target
        self._settled = settled or self._quiet_after_acquire
        self._cidr = cidr
        self._prefix = prefix
        self._ready: asyncio.Queue[NetworkSlot] = asyncio.Queue()
        #: slots handed out and not released yet, by index
        self._held: dict[int, NetworkSlot] = {}
        #: creations whose `acquire` was cancelled: their slots are nobody's (`close`)
        self._orphans: set[asyncio.Future[NetworkSlot]] = set()
        self._filler: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._host_addrs: tuple[str, ...] = ()
        self._next = 0
        self._last_acquire = 0.0
        self._batch: asyncio.Future[list[NetworkSlot | BaseException]] | None = None

    @property
    def cidr(self) -> str:
        return self._cidr

    async def start(self) -> None:
        # what a SIGKILLed node of this prefix left first: its slots' routes are its own,
        # and a node with a prefix of its own was refused a restart over them
        stale = await asyncio.to_thread(sweep_stale, self._prefix, self._cidr)
        if stale:
            log.info("slot pool: removed %d slots a dead process left behind", stale)
        overlap = await asyncio.to_thread(routed_overlap, self._cidr, self._prefix)
        if overlap:
            raise NetworkError(
                f"slot range {self._cidr} overlaps host routes {overlap}; set AENV_SLOT_CIDR"
            )
        # Guests never reach the node's own addresses nor any slot's veth (each host end is
        # the node too), whatever CIDRs a policy allows.
        self._host_addrs = (*await asyncio.to_thread(host_addresses), self._cidr)
        self._filler = asyncio.create_task(self._fill(), name="slot-pool-filler")

    async def acquire(self, policy: EgressPolicy | None = None) -> NetworkSlot:
        """A ready slot with `policy` applied (a default-policy slot costs nothing extra)."""
        try:
            slot = self._ready.get_nowait()
        except asyncio.QueueEmpty:
            # shielded: a cancelled acquire (a start cancelled by the node's stop) leaves
            # its creation thread running, and the namespace it makes must not outlive
            # the node: `close` waits for it and destroys it
            creating = asyncio.ensure_future(self._create_one())
            try:
                slot = await asyncio.shield(creating)
            except asyncio.CancelledError:
                self._orphans.add(creating)
                raise
        self._held[slot.address.index] = slot
        self._last_acquire = time.monotonic()
        self._wake.set()
        await self.apply(slot, policy)
        return slot

    async def apply(self, slot: NetworkSlot, policy: EgressPolicy | None) -> None:
        """Give a slot in use another egress policy (a warm VM claimed by a sandbox with
        a policy of its own); nothing to do when it already has it."""
        if policy is not None and policy != slot.policy:
            await asyncio.to_thread(update_policy, slot, policy, self._host_addrs)

    async def release(self, slot: NetworkSlot, *, background: bool = False) -> None:
        """Destroy a used slot (conntrack and ARP state must not leak to the next guest);
        `background`: nobody waits for it, so after `settled` and at the lowest priority."""
        if background:
            await self._settled()
            await in_background(destroy_slot, slot)
        else:
            await asyncio.to_thread(destroy_slot, slot)
        self._held.pop(slot.address.index, None)
        self._wake.set()

    async def close(self) -> None:
        if self._filler:
            self._filler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._filler
        if self._batch is not None:
            for slot in await self._batch:
                if isinstance(slot, NetworkSlot):
                    self._ready.put_nowait(slot)
            self._batch = None
        for done in await asyncio.gather(*self._orphans, return_exceptions=True):
            if isinstance(done, NetworkSlot):
                self._ready.put_nowait(done)
        self._orphans.clear()
        while not self._ready.empty():
            await asyncio.to_thread(destroy_slot, self._ready.get_nowait())
        # handed out and never released: its VM's start was cancelled after the acquire
        # (the node's stop); every VM is gone by now (`Runtime.close`), so these are leaks
        for index, slot in sorted(self._held.items()):
            log.warning("slot pool: slot %d was never released; destroying it", index)
            await asyncio.to_thread(destroy_slot, slot)
        self._held.clear()

    async def _fill(self) -> None:
        while True:
            while (missing := self._target - self._ready.qsize()) > 0:
                await self._settled()
                # a few at a time: after a 16-way fork the pool must be whole again soon
                # shielded: a close() that cancels the filler mid-batch still gets (and
                # destroys) the slots whose creation threads were already running
                pending = asyncio.gather(
                    *(
                        self._create_one(background=True)
                        for _ in range(min(missing, FILL_PARALLEL))
                    ),
                    return_exceptions=True,
                )
                self._batch = pending
                batch = await asyncio.shield(pending)
                self._batch = None
                for slot in batch:
                    if isinstance(slot, NetworkSlot):
                        self._ready.put_nowait(slot)
                    else:
                        log.error("slot pool: %s", slot)
                if not any(isinstance(slot, NetworkSlot) for slot in batch):
                    await asyncio.sleep(1.0)
            self._wake.clear()
            await self._wake.wait()

    async def _quiet_after_acquire(self) -> None:
        """Without a runtime to ask: wait for a moment without acquires."""
        waited = 0.0
        while waited < REFILL_MAX_WAIT_S and (
            (quiet := time.monotonic() - self._last_acquire) < REFILL_QUIET_S
        ):
            await asyncio.sleep(REFILL_QUIET_S - quiet)
            waited += REFILL_QUIET_S - quiet

    async def _create_one(self, *, background: bool = False) -> NetworkSlot:
        cap = slot_capacity(self._cidr)
        for _ in range(cap):
            index = self._next
            self._next = (self._next + 1) % cap
            if index in self._held:
                continue
            fd = try_lock(index, self._prefix)
            if fd is None:
                continue
            addr = slot_address(index, self._cidr, self._prefix)
            run = in_background if background else asyncio.to_thread
            try:
                return await run(create_slot, addr, lock_fd=fd, host_addresses=self._host_addrs)
            except NetworkError:
                os.close(fd)
                raise
        raise NetworkError(f"no free network slot in {self._cidr}")
