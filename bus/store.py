"""The event store: append with optimistic concurrency, load by folding a subject.

One subject per aggregate in AENV_EVT. An append carries `Nats-Msg-Id` = event id (dedup)
and `Nats-Expected-Last-Subject-Sequence` = the stream sequence of the aggregate's last event
as the writer saw it, so two writers deciding on the same version cannot both succeed.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Generic, TypeAlias, TypeVar
from uuid import UUID

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from bus import headers as h
from bus.envelope import (
    MessageContext,
    decode_event,
    derive_event_id,
    encode_event,
)
from bus.errors import ConcurrencyError, PublishError, StaleDuplicate
from bus.feed import EventFeed
from bus.publisher import JetStreamPublisher
from bus.records import NEW, RecordedEvent, Version
from bus.settings import BusSettings
from bus.subjects import AggregateKind, Names
from bus.tracing import publish_span
from domain import Aggregate, Command, CommandRejected, Event
from domain import apikey as ak
from domain import build as bd
from domain import buildkey as bk
from domain import image as im
from domain import lease as ls
from domain import node as nd
from domain import sandbox as sb
from domain import template as tp
from domain import volume as vo

__all__ = [
    "ApiKeyStore",
    "BuildKeyStore",
    "BuildStore",
    "EventStore",
    "ImageStore",
    "LeaseStore",
    "NodeStore",
    "RecordedEvent",  # re-exported
    "SandboxStore",
    "TemplateStore",
    "Version",  # re-exported
    "VolumeStore",
]

S = TypeVar("S")
C = TypeVar("C", bound=Command)

_WRONG_LAST_SEQUENCE = (10071, 10164)  # JSStreamWrongLastSequence(Constant)Err
#: Aggregates whose folded state a process keeps (LRU).
STATE_CACHE_SIZE = 4096


class EventStore(Generic[S, C]):
    """The event log of one aggregate kind, with the domain's functions over it (from its
    `domain.aggregates` entry): `evolve` (the fold that rebuilds a state) and `decide`
    (what a command `C` appends), which `bus.decisions.execute` runs."""

    NEW = NEW

    def __init__(
        self,
        js: JetStreamContext,
        publisher: JetStreamPublisher,
        settings: BusSettings,
        aggregate: Aggregate[S, C, Any],
    ) -> None:
        self._js = js
        self._settings = settings
        self._publisher = publisher
        self._names = Names(settings.bus_prefix)
        self._stream = self._names.event_stream
        self._kind = aggregate.kind
        self.evolve: Callable[[S | None, Event], S | None] = aggregate.evolve
        self.decide: Callable[[S | None, C], Sequence[Event]] = aggregate.decide
        #: Direct gets are answered by any replica, a follower a step behind the leader
        #: included: one API would then say 404 for the sandbox another API just created
        #: (seen once in 20,000 lifecycles of bench/fleet_sim.py at R3). Replicated, reads
        #: go to the stream's leader (`STREAM.MSG.GET`), which has every acknowledged write.
        self._direct = settings.replicas <= 1
        #: folded states by aggregate (states are frozen: sharing them is safe); a load
        #: then costs one round trip when nothing changed, plus one per newer event
        self._states: OrderedDict[str, tuple[S | None, Version]] = OrderedDict()

    @property
    def kind(self) -> AggregateKind:
        return self._kind

    def subject(self, aggregate_id: str) -> str:
        return self._names.events(self._kind, aggregate_id)

    # -- write ---------------------------------------------------------------------------
    async def append(
        self,
        aggregate_id: str,
        expected: Version,
        new_events: Sequence[Event],
        *,
        context: MessageContext | None = None,
    ) -> Version:
        """Append `new_events` after `expected`; the aggregate's new version.

        Raises `ConcurrencyError` if another writer appended since `expected` was loaded,
        and its `StaleDuplicate` when the event was stored before this call (same id: an
        earlier run of the same command). Events are stored one by one, each guarded by its
        predecessor's sequence: JetStream
        (before 2.12) has no atomic multi-message publish, and `decide` yields at most one
        event per command, which keeps every append atomic in practice.
        """
        ctx = context or MessageContext()
        subject = self.subject(aggregate_id)
        version = expected
        for event in new_events:
            event_id = derive_event_id(ctx.causation_id, aggregate_id, version.revision)
            _, data = encode_event(
                event,
                event_id=event_id,
                aggregate_id=aggregate_id,
                aggregate_version=version.revision + 1,
                context=ctx,
            )
            hdrs = {
                h.MSG_ID: str(event_id),
                h.EXPECTED_LAST_SUBJECT_SEQUENCE: str(version.seq),
            }
            with publish_span(subject, str(event_id), hdrs):
                ack, ours = await self._publish(subject, data, hdrs, version.seq)
            if ack.duplicate and not ours:
                raise StaleDuplicate(subject, version.seq, ack.seq)
            version = Version(version.revision + 1, ack.seq)
        cached = self._states.get(aggregate_id)
        if expected == NEW or (cached is not None and cached[1] == expected):
            # what we just wrote extends what we knew: the next load needs no reads
            state = None if expected == NEW else cached[0]  # type: ignore[index]
            for event in new_events:
                state = self.evolve(state, event)
            self._remember(aggregate_id, state, version)
        return version

    async def _publish(
        self, subject: str, data: bytes, hdrs: dict[str, str], seq: int
    ) -> tuple[PubAck, bool]:
        """The ack, and whether a duplicate in it may be our own earlier attempt (an ack
        lost to a timeout or a leader change): it carries the sequence the event was
        first stored at."""
        try:
            return await self._publisher.publish_stored(
                subject, data, hdrs, budget_s=self._settings.publish_retry_s
            )
        except APIError as e:
            if e.err_code in _WRONG_LAST_SEQUENCE:
                raise ConcurrencyError(subject, seq, e.description or "") from e
            raise PublishError(f"{subject}: {e}") from e
        except NoStreamResponseError as e:
            raise PublishError(f"{subject}: no stream stores it") from e
        except (NatsTimeoutError, TimeoutError) as e:
            raise PublishError(
                f"{subject}: no ack within {self._settings.publish_retry_s:.0f} s"
            ) from e

    async def append_rejection(
        self, aggregate_id: str, rejection: CommandRejected, *, context: MessageContext
    ) -> Version:
        """Append a `CommandRejected` at whatever version the aggregate is (it changes no
        state, so it never conflicts with a decision; only the position is raced)."""
        return await self.append_at_end(aggregate_id, [rejection], context=context)

    async def append_at_end(
        self, aggregate_id: str, events: Sequence[Event], *, context: MessageContext
    ) -> Version:
        """Append events that decide nothing on the state (a rejection, a fact reported by a
        worker) after whatever the aggregate holds now, retrying only the position race."""
        for _ in range(10):
            version = await self.version(aggregate_id)
            try:
                return await self.append(aggregate_id, version, events, context=context)
            except StaleDuplicate as e:  # recorded already (a redelivery): once is enough
                return Version(version.revision + 1, e.stored_seq)
            except ConcurrencyError:
                continue
        raise PublishError(f"cannot append to {aggregate_id}: too much contention")

    # -- read (no spans: reading history is not a hop of a request) -----------------------
    async def tail_seq(self) -> int:
        """The stream sequence of this kind's latest event, any aggregate (one direct get
        on the kind's wildcard subject; 0 when there is none): what a projection of this
        kind must have folded to show everything stored so far."""
        try:
            raw = await self._js.get_last_msg(
                self._stream, self._names.events_of_kind(self._kind), direct=self._direct
            )
        except NotFoundError:
            return 0
        return raw.seq or 0

    async def last_event_at(self, aggregate_id: str) -> datetime | None:
        """When the aggregate's latest event happened (None: no events)."""
        _, rec = await self._last(aggregate_id)
        return rec.envelope.occurred_at if rec is not None else None

    async def version(self, aggregate_id: str) -> Version:
        """The aggregate's current version, from its last message only."""
        return (await self._last(aggregate_id))[0]

    async def _last(self, aggregate_id: str) -> tuple[Version, RecordedEvent | None]:
        """The aggregate's version and its last event (one direct get)."""
        subject = self.subject(aggregate_id)
        try:
            raw = await self._js.get_last_msg(self._stream, subject, direct=self._direct)
        except NotFoundError:
            return NEW, None
        env, event = decode_event(raw.data or b"")
        rec = RecordedEvent(seq=raw.seq or 0, subject=subject, envelope=env, event=event)
        return Version(env.aggregate_version, rec.seq), rec

    async def read(
        self, aggregate_id: str, after_seq: int = 0, limit: int | None = None
    ) -> list[RecordedEvent]:
        """Every event of the aggregate stored after stream sequence `after_seq`, in order
        (at most `limit`: a caller that knows how many there are skips the final probe)."""
        subject = self.subject(aggregate_id)
        out: list[RecordedEvent] = []
        seq = after_seq + 1
        while limit is None or len(out) < limit:
            try:
                # Get of the next message on this subject at or after `seq`: one round trip
                # per event and no consumer to create/delete, which is the cheaper way for
                # aggregates of a handful to a few dozen events.
                raw = await self._js.get_msg(
                    self._stream, seq=seq, subject=subject, next=True, direct=self._direct
                )
            except NotFoundError:
                return out
            env, event = decode_event(raw.data or b"")
            out.append(RecordedEvent(seq=raw.seq or 0, subject=subject, envelope=env, event=event))
            seq = (raw.seq or 0) + 1
        return out

    def watch(self, aggregate_id: str, after_seq: int = 0) -> EventFeed:
        """The aggregate's events stored after `after_seq`, as they arrive (an `EventFeed`
        to use with `async with`). Open it at the version you decided on, *then* publish the
        command: the outcome cannot slip between the two."""
        return EventFeed(
            self._js,
            self._settings,
            self.subject(aggregate_id),
            start_seq=after_seq + 1,
            max_batch=64,
        )

    async def wait_for_outcome(
        self,
        aggregate_id: str,
        command_id: UUID,
        after_seq: int,
        outcomes: tuple[type[Event], ...],
        timeout: float,
    ) -> RecordedEvent | None:
        """The first event caused by `command_id` whose type is an outcome (or a
        `CommandRejected`) after `after_seq`; None on timeout (the API answers 504 then)."""
        deadline = asyncio.get_running_loop().time() + timeout
        async with self.watch(aggregate_id, after_seq) as feed:
            while (left := deadline - asyncio.get_running_loop().time()) > 0:
                for rec in await feed.next_batch(left):
                    if rec.envelope.causation_id == command_id and isinstance(
                        rec.event, (*outcomes, CommandRejected)
                    ):
                        return rec
        return None

    async def load(self, aggregate_id: str) -> tuple[S | None, Version]:
        """The aggregate's state (None if it never existed) and its version, for `decide`.

        Folded incrementally from this process's last fold of it: events are immutable, so
        only those after the cached version are read, and the last of them comes with the
        version check itself (a pause since our last look costs 2 round trips, not 4). The
        check also notices a stream that was recreated, and then folds from scratch."""
        cached = self._states.get(aggregate_id)
        state: S | None = None
        version = NEW
        if cached is not None:
            last, last_rec = await self._last(aggregate_id)
            if last == cached[1]:
                self._states.move_to_end(aggregate_id)
                return cached
            newer = last.seq > cached[1].seq and last.revision > cached[1].revision
            if last_rec is not None and newer:
                state, version = cached
                between = last.revision - version.revision - 1
                recs = await self.read(aggregate_id, after_seq=version.seq, limit=between)
                if len(recs) == between and all(r.seq < last.seq for r in recs):
                    for rec in [*recs, last_rec]:
                        state = self.evolve(state, rec.event)
                    self._remember(aggregate_id, state, last)
                    return state, last
                state, version = None, NEW  # not the history we expected: fold it all
        for rec in await self.read(aggregate_id, after_seq=version.seq):
            state = self.evolve(state, rec.event)
            version = Version(rec.envelope.aggregate_version, rec.seq)
        if version != NEW:
            self._remember(aggregate_id, state, version)
        return state, version

    def cached(self, aggregate_id: str) -> tuple[S | None, Version] | None:
        """This process's last fold of the aggregate, unchecked: a guess to decide on
        optimistically (an append on it fails if it is stale), never an answer to show."""
        return self._states.get(aggregate_id)

    def observe(self, rec: RecordedEvent) -> None:
        """An event this process saw the log store (`bus.answers`): folded into the cached
        state when it is the very next one (or an aggregate's first), so the next `load` is
        one version check. Any other case leaves the cache alone — `load` catches up from
        what it has."""
        aggregate_id = rec.envelope.aggregate_id
        state, version = self._states.get(aggregate_id) or (None, NEW)
        if rec.envelope.aggregate_version == version.revision + 1 and rec.seq > version.seq:
            self._remember(
                aggregate_id,
                self.evolve(state, rec.event),
                Version(rec.envelope.aggregate_version, rec.seq),
            )

    def _remember(self, aggregate_id: str, state: S | None, version: Version) -> None:
        self._states[aggregate_id] = (state, version)
        self._states.move_to_end(aggregate_id)
        while len(self._states) > STATE_CACHE_SIZE:
            self._states.popitem(last=False)


SandboxStore: TypeAlias = EventStore[sb.Sandbox, sb.AnySandboxCommand]
TemplateStore: TypeAlias = EventStore[tp.Template, tp.AnyTemplateCommand]
ApiKeyStore: TypeAlias = EventStore[ak.ApiKey, ak.AnyApiKeyCommand]
BuildStore: TypeAlias = EventStore[bd.Build, bd.AnyBuildCommand]
VolumeStore: TypeAlias = EventStore[vo.Volume, vo.AnyVolumeCommand]
ImageStore: TypeAlias = EventStore[im.Image, im.AnyImageCommand]
BuildKeyStore: TypeAlias = EventStore[bk.BuildKey, bk.AnyBuildKeyCommand]
NodeStore: TypeAlias = EventStore[nd.Node, nd.AnyNodeCommand]
LeaseStore: TypeAlias = EventStore[ls.Lease, ls.AnyLeaseCommand]
