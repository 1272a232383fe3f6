"""The repository GC, run periodically by one node of the fleet (images-at-scale S11).

Every node tries each `every_s`; the one that takes the lease (`bus.leases`, a KV bucket
whose TTL is `every_s`) collects the blobs no manifest names (`gc.collect_garbage`),
sparing those younger than `min_age` (an upload in flight writes its blobs before its
manifest), then forgets the images no capture names (`janitor.forget_images`): their
chunks go in the next round, a period after their manifest. The lease is
not released: it runs out by itself, so the fleet collects about once per period whoever
does it. A round longer than the period may overlap the next one; that is harmless (both
delete only what no manifest names), merely wasted work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta

from bus import Bus
from bus.leases import Lease
from workers.snapshot import gc
from workers.snapshot.gcmetrics import GcMetrics
from workers.snapshot.janitor import RepositoryJanitor
from workers.snapshot.results import GcReport

__all__ = ["LEASE_KEY", "RepositoryGc"]

log = logging.getLogger(__name__)

LEASE_KEY = "repository"


class RepositoryGc:
    """Periodic, leased GC of the snapshot repository `janitor` tidies."""

    def __init__(
        self,
        bus: Bus,
        janitor: RepositoryJanitor,
        node_id: str,
        *,
        every_s: float,
        min_age: timedelta,
        image_grace: timedelta,
        metrics: GcMetrics | None = None,
    ) -> None:
        self.bus = bus
        self.janitor = janitor
        self.node_id = node_id
        self.every_s = every_s
        self.min_age = min_age
        self.image_grace = image_grace
        self.metrics = metrics or janitor.metrics
        self._lease: Lease | None = None
        self._task: asyncio.Task[None] | None = None

    async def lease(self) -> Lease:
        if self._lease is None:
            self._lease = await Lease.open(
                self.bus.js,
                self.bus.names.gc_lease_bucket,
                LEASE_KEY,
                ttl_s=self.every_s,
                replicas=self.bus.settings.replicas,
            )
        return self._lease

    async def run_once(self) -> GcReport | None:
        """One round if this node gets the lease (its report), else None."""
        if not await (await self.lease()).acquire(self.node_id):
            self.metrics.round("skipped")
            return None
        try:
            report = await gc.collect_garbage(
                self.janitor.store, self.janitor.retry, min_age=self.min_age
            )
            # after the blobs: a forgotten image's chunks go a period later, so a node that
            # read its manifest just before finishes its fetch
            forgotten = await self.janitor.forget_images(grace=self.image_grace)
        except Exception:
            self.metrics.round("failed")
            raise
        self.metrics.collected(report)
        log.info(
            "repository gc: %d blobs deleted (%.1f MiB), %d kept, %d too young; "
            "%d images forgotten",
            len(report.deleted),
            report.bytes_freed / 2**20,
            report.kept,
            report.spared_young,
            len(forgotten),
            extra={
                "gc_deleted": len(report.deleted),
                "gc_bytes_freed": report.bytes_freed,
                "gc_kept": report.kept,
                "gc_young": report.spared_young,
                "gc_images_forgotten": len(forgotten),
            },
        )
        return report

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="repository-gc")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        # The first try waits a little: a starting node has better things to do, and a
        # fleet restarted at once must not all list the store in the same second.
        await asyncio.sleep(min(self.every_s, 60.0))
        while True:
            try:
                await self.run_once()
            except Exception as e:  # the next period retries: every step is idempotent
                log.warning("repository gc failed: %s", e)
            await asyncio.sleep(self.every_s)
