"""Per image opened by this service: replay its stored read trace, or record one.

On an export's first open (per process) one background task looks the image's trace up
in the repository (`ImageRepository.get_trace`), so the open itself waits for nothing
more than the image's manifest. Reads are recorded from the open on, while the look-up
runs: with no trace stored, the first `window_s` seconds of reads become the image's
trace, stored beside its manifest unless another node's arrived meanwhile (two nodes
recording at once: the last write wins, either is as good). With a trace, its chunks are
fetched ahead (`prefetch`). A repository that cannot answer costs the image its trace,
never a read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime

from workers.snapshot.blocks.export import Export
from workers.snapshot.blocks.prefetch import prefetch
from workers.snapshot.blocks.stats import BlockStats
from workers.snapshot.blocks.trace import TraceRecorder, TraceSettings, prefetch_plan
from workers.snapshot.images import ImageRepository
from workers.snapshot.manifest import TraceManifest

__all__ = ["WorkingSets"]

log = logging.getLogger(__name__)


class WorkingSets:
    """The trace tasks of every export the service opened."""

    def __init__(self, images: ImageRepository, stats: BlockStats, settings: TraceSettings):
        self.images = images
        self.stats = stats
        self.settings = settings
        self._tasks: set[asyncio.Task[None]] = set()

    def opened(self, export: Export) -> None:
        """`export` was just opened for the first time: start its recording, and its
        look-up (which ends the recording when a trace is found)."""
        s = self.settings
        if s.window_s <= 0 and s.concurrency <= 0:
            return
        if s.window_s > 0:
            export.recorder = TraceRecorder(time.monotonic(), s.window_s, s.limit)
        task = asyncio.create_task(self._run(export))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Cancel what is running (a recording not yet stored is dropped: the next open
        of the image, on any node, records again)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(self, export: Export) -> None:
        try:
            trace = await self.images.get_trace(export.digest)
        except Exception as e:  # the store is down or the trace unreadable: no trace work
            log.warning("blocks: no trace for %s: %s", export.digest, e)
            export.recorder = None
            return
        if trace is not None:
            export.recorder = None
            await self._replay(export, trace)
        elif export.recorder is not None:
            await self._record(export)

    async def _replay(self, export: Export, trace: TraceManifest) -> None:
        self.stats.trace_loaded += 1
        plan = prefetch_plan(trace.chunks, export.disk)
        t0 = time.monotonic()

        def landed(nbytes: int) -> None:
            self.stats.prefetched(export.stats, nbytes)

        got = await prefetch(
            export.cache,
            plan,
            concurrency=self.settings.concurrency,
            protect_s=self.settings.protect_s,
            on_fetched=landed,
        )
        log.info(
            "blocks: %s: prefetched %d of %d traced chunks (%d bytes) in %.2f s%s",
            export.digest,
            got.chunks,
            len(plan),
            got.bytes,
            time.monotonic() - t0,
            ", stopped: cache full" if got.stopped else "",
        )

    async def _record(self, export: Export) -> None:
        recorder = export.recorder
        assert recorder is not None
        full = asyncio.Event()  # a trace full before its window ends is stored at once
        recorder.on_full = full.set
        remaining = recorder.started + recorder.window_s - time.monotonic()
        if not recorder.done(time.monotonic()):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(full.wait(), max(0.0, remaining))
        export.recorder = None
        if not recorder.chunks:
            return  # nothing read (a probe of its size): the next open records again
        trace = TraceManifest(
            digest=export.digest,
            created_at=datetime.now(UTC),
            window_s=recorder.window_s,
            chunks=recorder.chunks,
        )
        try:
            if await self.images.get_trace(export.digest) is not None:
                return  # another node's recording landed first: keep it
            await self.images.put_trace(trace)
        except Exception as e:
            log.warning("blocks: cannot store the trace of %s: %s", export.digest, e)
            return
        self.stats.trace_recorded += 1
        log.info("blocks: %s: trace of %d chunks stored", export.digest, len(trace.chunks))
