"""A node's lines in a template build's log: an image import's progress (pull, conversion,
first boot) reaches the user's `Template.build(on_build_logs=…)` like the builder's own.

Lines arrive from the thread that converts the image; they are appended in order by one
task on the event loop (`LogTemplateBuild`, the build aggregate's own command), and a lost
line never fails the import.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from types import TracebackType

from bus import Bus, MessageContext
from bus.decisions import execute
from bus.tasks import cancel_and_wait
from domain import build as bd

__all__ = ["BuildLog"]

log = logging.getLogger(__name__)


class BuildLog:
    def __init__(self, bus: Bus, build_id: str | None, context: MessageContext) -> None:
        self.bus = bus
        self.build_id = build_id
        self.context = context
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> BuildLog:
        if self.build_id is not None:
            self._task = asyncio.create_task(self._write(self.build_id))
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is None:
            return
        self._queue.put_nowait(None)  # written up to here, then done
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 10)
        except TimeoutError:
            await cancel_and_wait(self._task)

    def line(self, message: str) -> None:
        """A progress line, from any thread."""
        if self.build_id is not None:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, message)

    async def _write(self, build_id: str) -> None:
        while (message := await self._queue.get()) is not None:
            entry = bd.BuildLogEntry(
                at=datetime.now(UTC), level="info", message=message, step="base"
            )
            try:
                await execute(
                    self.bus.builds,
                    bd.LogTemplateBuild(build_id=build_id, entries=(entry,)),
                    self.context,
                )
            except Exception as e:  # a lost line must not fail the import
                log.warning("build %s: log line lost: %s", build_id, e)
