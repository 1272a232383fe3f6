"""The projector: runs one projection over the event stream, from its checkpoint, forever.

Each batch is applied, and the checkpoint advanced, in ONE transaction that first locks the
checkpoint row: events at or below the stored checkpoint are skipped (a crash between apply
and commit rolls both back, so nothing is applied twice or lost), and two replicas, or a
rebuild swapping tables in, never interleave.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from nats.js import JetStreamContext
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from bus import BusSettings, EventFeed, Names, RecordedEvent
from bus.supervised import supervise
from bus.tasks import cancel_and_wait
from bus.tracing import project_spans
from projections import checkpoints
from projections.base import Projection
from projections.errors import ProjectionError, ProjectionTimeout

__all__ = ["Projector"]

log = logging.getLogger(__name__)


class Projector:
    """Keeps one projection's tables up to date; `wait_for(seq)` gives read-your-writes."""

    def __init__(
        self,
        engine: AsyncEngine,
        js: JetStreamContext,
        bus_settings: BusSettings,
        projection: Projection,
        *,
        max_batch: int = 500,
        retry_delay_s: float = 1.0,
        linger_s: float = 0.05,
    ) -> None:
        self._engine = engine
        self._js = js
        self._bus_settings = bus_settings
        self._projection = projection
        self._filter = Names(bus_settings.bus_prefix).events_of_kind(projection.kind)
        self._max_batch = max_batch
        self._retry_delay_s = retry_delay_s
        # Up to 10 ms of extra read-your-writes latency buys batches of hundreds under load.
        self._linger_s = linger_s
        self._position = 0
        self._advanced = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        #: the feed `run` follows (None between restarts)
        self._following: EventFeed | None = None

    @property
    def name(self) -> str:
        return self._projection.name

    @property
    def position(self) -> int:
        """Last stream sequence this process knows to be committed."""
        return self._position

    async def apply_batch(self, batch: Sequence[RecordedEvent]) -> int:
        """Apply `batch` (in stream order) and advance the checkpoint, atomically."""
        name = self._projection.name
        try:
            async with self._engine.begin() as conn:
                stored = await checkpoints.lock(conn, name)
                fresh = [r for r in batch if r.seq > stored]
                if fresh:
                    await self._projection.apply(conn, fresh)
                    await checkpoints.write(conn, name, fresh[-1].seq)
        except SQLAlchemyError as e:
            raise ProjectionError(f"{name}: batch up to {batch[-1].seq} not applied: {e}") from e
        await self._moved(max(stored, batch[-1].seq if batch else stored))
        return self._position

    async def _moved(self, seq: int) -> None:
        if seq > self._position:
            self._position = seq
            async with self._advanced:
                self._advanced.notify_all()

    async def _start_seq(self) -> int:
        async with self._engine.begin() as conn:
            await checkpoints.ensure(conn, self._projection.name)
            stored = await checkpoints.read(conn, self._projection.name)
        await self._moved(stored)
        return stored + 1

    def _feed(self, start_seq: int) -> EventFeed:
        return EventFeed(
            self._js,
            self._bus_settings,
            self._filter,
            start_seq=start_seq,
            max_batch=self._max_batch,
        )

    async def catch_up(self, idle_timeout_s: float = 0.5) -> int:
        """Apply everything stored so far, then return the position (rebuilds, tests, CLI)."""
        async with self._feed(await self._start_seq()) as feed:
            while not feed.caught_up():
                batch = await feed.next_batch(idle_timeout_s)
                if batch:
                    await self.apply_batch(batch)
            return self._position

    async def run(self) -> None:
        """Follow the stream until cancelled; on errors, restart from the checkpoint."""
        while True:
            try:
                async with self._feed(await self._start_seq()) as feed:
                    self._following = feed
                    while True:
                        batch = await feed.next_batch(1.0, linger=self._linger_s)
                        if batch:
                            with project_spans(batch, self._projection.name):
                                await self.apply_batch(batch)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "projection %s failed; restarting from its checkpoint", self._projection.name
                )
                await asyncio.sleep(self._retry_delay_s)
            finally:
                self._following = None

    async def lag(self) -> int | None:
        """Events of this projection's kind in the log it has not applied yet (the batch
        being applied counts as applied); None while it is not following the log."""
        feed = self._following
        return await feed.behind() if feed is not None else None

    async def start(self) -> None:
        # its own loop restarts from the checkpoint after an error; a death it does not
        # catch is restarted too, or the role goes down (`bus.supervised`)
        self._task = supervise(f"projector:{self.name}", self.run)

    async def stop(self) -> None:
        """Stop after the batch in progress (its transaction commits or rolls back whole)."""
        await cancel_and_wait(self._task)
        self._task = None

    async def wait_for(self, seq: int, timeout: float = 5.0) -> int:
        """Wait until this projector has committed stream sequence `seq`.

        Works in the process running the projector; elsewhere use
        `projections.checkpoints.wait_for(engine, name, seq)`, which polls the table.
        """

        async def reached() -> None:
            async with self._advanced:
                await self._advanced.wait_for(lambda: self._position >= seq)

        try:
            await asyncio.wait_for(reached(), timeout)
        except TimeoutError:
            raise ProjectionTimeout(f"{self.name} at {self._position}, not {seq}") from None
        return self._position
