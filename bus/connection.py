"""The bus as one resource: connection, JetStream context, names, stores and command bus."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from aenv.domain import apikey as ak
from aenv.domain import build as bd
from aenv.domain import sandbox as sb
from aenv.domain import template as tp
from bus.answers import Answers
from bus.commands import CommandBus
from bus.publisher import JetStreamPublisher
from bus.settings import BusSettings
from bus.setup import ensure_streams
from bus.store import EventStore
from bus.subjects import AggregateKind, Names

__all__ = ["Bus"]


@dataclass
class Bus:
    """Everything a process needs to talk to the log. Close it last (it owns the socket)."""

    nc: NATS
    js: JetStreamContext
    settings: BusSettings
    names: Names
    publisher: JetStreamPublisher
    sandboxes: EventStore[sb.Sandbox]
    templates: EventStore[tp.Template]
    api_keys: EventStore[ak.ApiKey]
    builds: EventStore[bd.Build]
    commands: CommandBus
    _answers: Answers | None = field(default=None, init=False, repr=False)
    _answers_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)

    @classmethod
    async def connect(
        cls, settings: BusSettings, *, name: str = "aenv", setup: bool = True, retry: bool = True
    ) -> Bus:
        """Connect to NATS and (by default) make sure the streams exist as configured.

        Services retry forever (NATS may come up after them). A short-lived client (the CLI)
        passes `retry=False`: an unreachable server then raises within seconds, quietly,
        instead of being retried (and logged) until someone presses Ctrl-C.
        """
        if retry:
            nc = await nats.connect(settings.nats_url, name=name, max_reconnect_attempts=-1)
        else:
            # nats-py retries forever with 0 attempts; 1 means one retry after the first try
            nc = await nats.connect(settings.nats_url, name=name, max_reconnect_attempts=1,
                                    reconnect_time_wait=0.5, connect_timeout=3,
                                    error_cb=_ignore)  # fmt: skip
        js = nc.jetstream(timeout=settings.request_timeout_s)
        if setup:
            await ensure_streams(js, settings)
        pub = JetStreamPublisher(nc, settings.request_timeout_s)
        return cls(
            nc=nc,
            js=js,
            settings=settings,
            names=Names(settings.bus_prefix),
            publisher=pub,
            sandboxes=EventStore.sandboxes(js, pub, settings),
            templates=EventStore.templates(js, pub, settings),
            api_keys=EventStore.api_keys(js, pub, settings),
            builds=EventStore.builds(js, pub, settings),
            commands=CommandBus(pub, settings),
        )

    async def answers(self) -> Answers:
        """This process's answers to sandbox commands (`bus.answers`), started on first use:
        only a process that waits on commands (the API) follows the log for them. Stored
        sandbox events it sees also keep `sandboxes`' cache current."""
        async with self._answers_lock:
            if self._answers is None:
                board = Answers(
                    self.js,
                    self.names.event_stream,
                    self.names.events_of_kind(AggregateKind.SANDBOX),
                    on_event=self.sandboxes.observe,
                )
                await board.start()
                self._answers = board
        return self._answers

    async def close(self) -> None:
        """Flush pending publishes and close (drain lets subscriptions finish their messages)."""
        if self._answers is not None:
            await self._answers.close()
            self._answers = None
        if not self.nc.is_closed:
            await self.publisher.close()
            await self.nc.drain()


async def _ignore(_: Exception) -> None:
    """A CLI reports the failure the call raises; nats-py would also log each attempt."""
