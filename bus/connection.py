"""The bus as one resource: connection, JetStream context, names, stores and command bus."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from bus.answers import Answers
from bus.commands import CommandBus
from bus.envelope import MessageContext
from bus.publisher import JetStreamPublisher
from bus.records import RecordedEvent
from bus.settings import BusSettings
from bus.setup import ensure_streams
from bus.store import (
    ApiKeyStore,
    BuildKeyStore,
    BuildStore,
    EventStore,
    ImageStore,
    LeaseStore,
    NodeStore,
    SandboxStore,
    TemplateStore,
    VolumeStore,
)
from bus.subjects import AggregateKind, Names
from domain import AGGREGATES, Aggregate, Command, CommandRejected, Event
from domain import sandbox as sb
from domain.aggregates import (
    APIKEY,
    BUILD,
    BUILDKEY,
    IMAGE,
    LEASE,
    NODE,
    SANDBOX,
    TEMPLATE,
    VOLUME,
)

log = logging.getLogger(__name__)

__all__ = ["Bus", "stores_of"]

S = TypeVar("S")
C = TypeVar("C", bound=Command)


def stores_of(
    js: JetStreamContext, publisher: JetStreamPublisher, settings: BusSettings
) -> dict[AggregateKind, EventStore[Any, Any]]:
    """An event store for every registered aggregate kind."""
    return {a.kind: EventStore(js, publisher, settings, a) for a in AGGREGATES}


@dataclass
class Bus:
    """Everything a process needs to talk to the log. Close it last (it owns the socket)."""

    nc: NATS
    js: JetStreamContext
    settings: BusSettings
    names: Names
    publisher: JetStreamPublisher
    #: one event store per `domain.AGGREGATES` entry, by kind (`store_of` builds them)
    stores: Mapping[AggregateKind, EventStore[Any, Any]]
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
            redo: set[asyncio.Task[None]] = set()

            async def setup_again() -> None:
                try:
                    await ensure_streams(js, settings)
                except Exception as e:  # a cluster still electing: the next reconnect redoes it
                    log.warning("setting the streams up again after a reconnect: %r", e)

            async def reconnected() -> None:
                # A NATS restarted without its memory buckets (secrets): make them again — in
                # a task of its own, never inside nats-py's reconnect, which retries its
                # loop on whatever the callback raises (a JetStream request timing out while
                # a cluster elects) with its previous read loop still reading: the next
                # attempt's read then collided with it ("readuntil() called while another
                # coroutine is already waiting"), the reconnect task died, and the client
                # stayed disconnected for good.
                if setup:
                    task = asyncio.create_task(setup_again(), name="bus-setup-again")
                    redo.add(task)
                    task.add_done_callback(redo.discard)

            nc = await nats.connect(
                settings.servers,
                name=name,
                max_reconnect_attempts=-1,
                reconnected_cb=reconnected,
                **settings.login(),
            )
        else:
            # nats-py retries forever with 0 attempts; 1 means one retry after the first try
            nc = await nats.connect(
                settings.servers,
                name=name,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.5,
                connect_timeout=3,
                error_cb=_ignore,
                **settings.login(),
            )
        js = nc.jetstream(timeout=settings.request_timeout_s)  # (the callback's, once set)
        if setup:
            try:
                await ensure_streams(js, settings)
            except BaseException:  # a refusal (replicas) or a timeout: no connection left open
                await nc.close()
                raise
        pub = JetStreamPublisher(nc, settings.request_timeout_s)
        return cls(
            nc=nc,
            js=js,
            settings=settings,
            names=Names(settings.bus_prefix),
            publisher=pub,
            stores=stores_of(js, pub, settings),
            commands=CommandBus(pub, settings),
        )

    def store(self, aggregate: Aggregate[S, C, Any]) -> EventStore[S, C]:
        """The event store of one aggregate kind, typed by its registry entry."""
        return cast("EventStore[S, C]", self.stores[aggregate.kind])

    # The kinds by name, for callers (typed; `tests/unit/bus/test_aggregate_registry.py`
    # checks every registered kind has one)
    @property
    def sandboxes(self) -> SandboxStore:
        return self.store(SANDBOX)

    @property
    def templates(self) -> TemplateStore:
        return self.store(TEMPLATE)

    @property
    def api_keys(self) -> ApiKeyStore:
        return self.store(APIKEY)

    @property
    def builds(self) -> BuildStore:
        return self.store(BUILD)

    @property
    def volumes(self) -> VolumeStore:
        return self.store(VOLUME)

    @property
    def images(self) -> ImageStore:
        """The fleet's one build of each recipe (`domain/image`): nodes claim, publish."""
        return self.store(IMAGE)

    @property
    def build_keys(self) -> BuildKeyStore:
        return self.store(BUILDKEY)

    @property
    def node_orders(self) -> NodeStore:
        """Operators' decisions about nodes (`domain/node`: the cordon), not their heartbeats
        (those are `bus.nodes`, in the nodes bucket)."""
        return self.store(NODE)

    @property
    def leases(self) -> LeaseStore:
        """Leases over sandboxes (`domain/lease`: renewed by a trainer, expired by the timer)."""
        return self.store(LEASE)

    @property
    def rejection_sinks(self) -> dict[str, EventStore[Any, Any]]:
        """Each aggregate kind's store, where a consumer appends a refused command's
        `CommandRejected` (`CommandConsumer`)."""
        return {kind: store for kind, store in self.stores.items()}

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

    async def send_and_wait(
        self,
        command: sb.SandboxCommand,
        *,
        node_id: str | None,
        until: tuple[type[Event], ...],
        timeout: float,
        actor: str | None = None,
        unclaimed: Callable[[], Awaitable[None]] | None = None,
        claim_within: float = 0.0,
    ) -> RecordedEvent | None:
        """Publish a sandbox command (to its node, or to placement when `node_id` is None)
        and return the first stored event it caused that is one of `until`, a
        `SandboxFailed` or a `CommandRejected` — or the sandbox's `SandboxKilled`, whoever
        killed it; None if none came within `timeout` (the command still runs).

        `unclaimed` (a create sent to placement): awaited when no node has taken the
        command — no event of it stored — within `claim_within` seconds; it withdraws the
        create, whose failure it appends is then the answer."""
        kinds: tuple[type[Event], ...] = (CommandRejected, *until, sb.SandboxFailed)
        answers = await self.answers()
        key = str(command.command_id)
        claimed = asyncio.Event()
        # a kill that overtakes the command (a pause, a fork) ends it without an answer
        # of its own: its waiter hears of the end instead of waiting out the timeout
        ends = () if isinstance(command, sb.KillSandbox) else (sb.SandboxKilled,)
        own = command.sandbox_id
        answer = answers.expect(
            # its own aggregate's: a fork's children are caused by the fork too, and a
            # child that failed to start answered the fork as failed
            key,
            lambda rec: isinstance(rec.event, kinds) and rec.envelope.aggregate_id == own,
            aggregate_id=command.sandbox_id,
            overtaken=lambda rec: isinstance(rec.event, ends),
            progress=lambda _: claimed.set(),
        )
        try:
            ctx = MessageContext(correlation_id=command.command_id, actor=actor)
            if node_id is None:
                await self.commands.to_placement(command, context=ctx)
            else:
                await self.commands.to_node(node_id, command, context=ctx)
            try:
                if unclaimed is not None:
                    taken: asyncio.Future[Any] = asyncio.ensure_future(claimed.wait())
                    pending: set[asyncio.Future[Any]] = {answer, taken}
                    done, _ = await asyncio.wait(
                        pending, timeout=claim_within, return_when=asyncio.FIRST_COMPLETED
                    )
                    taken.cancel()
                    if not done:
                        await unclaimed()
                return await asyncio.wait_for(answer, timeout)
            except TimeoutError:
                return None
        finally:
            answers.forget(key)

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
