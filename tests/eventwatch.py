"""Waiting on the event log itself (NATS, not the API) for the first event of a type: the
moment a command is accepted and its work under way — when a fault test strikes."""

from __future__ import annotations

import asyncio
import threading

import nats

from bus.envelope import decode_event
from domain import sandbox as sb


class FirstEvent:
    """Subscribes at once (returns once subscribed); `seen` is set, and `sandbox_id`
    known, when the first `kind` event is appended."""

    def __init__(self, nats_url: str, kind: type[sb.SandboxEvent]) -> None:
        self.kind = kind
        self.sandbox_id: str | None = None
        self.seen = threading.Event()
        self.subscribed = threading.Event()
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._run(nats_url),), daemon=True
        )
        self._thread.start()
        assert self.subscribed.wait(10)

    async def _run(self, url: str) -> None:
        nc = await nats.connect(url)
        try:
            sub = await nc.subscribe("aenv.evt.sandbox.*")
            self.subscribed.set()
            async for msg in sub.messages:
                env, event = decode_event(msg.data)
                if isinstance(event, self.kind):
                    self.sandbox_id = env.aggregate_id
                    self.seen.set()
                    return
        finally:
            await nc.close()
