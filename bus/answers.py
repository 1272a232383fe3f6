"""Answers to commands, read from the event log itself: one ordered consumer per process
over every sandbox event stored from its start on, handing each event to whoever waits on
the command that caused it.

From the log, not from a plain subscription to the aggregate's subject: NATS delivers a
message to the subject's subscribers whether or not the stream then stores it, so an
append JetStream refused (a concurrent writer won the expected-sequence check) looked
like an answer — an API could report "resumed" from an event that never became history.
A stored event also comes with its stream sequence, so each one the process sees can be
folded into its `EventStore` cache (`on_event`): the next load of that sandbox is one
version check, however recently a node appended to it — no per-command subscription, no
reading back of events the process has just watched go by.

An ordered consumer is recreated by the client from the last sequence it saw after a gap
or a reconnect, so a waiter never misses its answer for those; a waiter still bounds its
own wait (the API answers 504). nats-py recreates one that has seen nothing yet from
sequence 1: the events before our start are then skipped by their sequence, undecoded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from bus.feed import ORDERED_HEARTBEAT_S, recorded
from bus.records import RecordedEvent

__all__ = ["Answers"]

log = logging.getLogger(__name__)

Match = Callable[[RecordedEvent], bool]


class Answers:
    """Futures for command outcomes, settled by events as the log stores them."""

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        filter_subject: str,
        on_event: Callable[[RecordedEvent], None] | None = None,
    ) -> None:
        self._js = js
        self._stream = stream
        self._filter = filter_subject
        self._on_event = on_event
        self._waiting: dict[str, tuple[Match, asyncio.Future[RecordedEvent]]] = {}
        #: command id → told of every other event the command caused (its progress: a
        #: create's `SandboxRequested`, the sign that a node took it)
        self._progress: dict[str, Callable[[RecordedEvent], None]] = {}
        #: aggregate id → commands also answered by an event of it that `overtakes` them
        #: (whatever caused it: a kill that overtook a pause ends the pause's wait)
        self._watching: dict[str, dict[str, Match]] = {}
        self._aggregate_of: dict[str, str] = {}
        self._sub: JetStreamContext.PushSubscription | None = None
        #: the last stream sequence handed out (or stored before `start`): older ones are
        #: redeliveries of a recreated consumer
        self._seen = 0

    async def start(self) -> None:
        """Follow the log from now on; commands published afterwards get their answers."""
        self._seen = (await self._js.stream_info(self._stream)).state.last_seq
        self._sub = await self._js.subscribe(
            self._filter,
            stream=self._stream,
            cb=self._on_msg,
            ordered_consumer=True,
            idle_heartbeat=ORDERED_HEARTBEAT_S,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self._seen + 1
            ),
        )

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        for _, future in self._waiting.values():
            future.cancel()
        self._waiting.clear()
        self._progress.clear()
        self._watching.clear()
        self._aggregate_of.clear()

    def expect(
        self,
        command_id: str,
        match: Match,
        *,
        aggregate_id: str | None = None,
        overtaken: Match | None = None,
        progress: Callable[[RecordedEvent], None] | None = None,
    ) -> asyncio.Future[RecordedEvent]:
        """The first stored event caused by `command_id` that `match`es — or, given
        `aggregate_id` and `overtaken`, any event of that aggregate `overtaken` accepts;
        `progress` hears the command's other events as they are stored. Register before
        publishing the command; `forget` it when done waiting."""
        future: asyncio.Future[RecordedEvent] = asyncio.get_running_loop().create_future()
        self._waiting[command_id] = (match, future)
        if progress is not None:
            self._progress[command_id] = progress
        if aggregate_id is not None and overtaken is not None:
            self._watching.setdefault(aggregate_id, {})[command_id] = overtaken
            self._aggregate_of[command_id] = aggregate_id
        return future

    def forget(self, command_id: str) -> None:
        self._waiting.pop(command_id, None)
        self._progress.pop(command_id, None)
        aggregate_id = self._aggregate_of.pop(command_id, None)
        if aggregate_id is not None:
            commands = self._watching[aggregate_id]
            del commands[command_id]
            if not commands:
                del self._watching[aggregate_id]

    async def _on_msg(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        if seq <= self._seen:
            return
        self._seen = seq
        try:
            rec = recorded(msg)
        except Exception:  # not ours to judge here: a reader of this aggregate will say why
            log.warning("undecodable event at %s on %s", seq, msg.subject)
            return
        if self._on_event is not None:
            self._on_event(rec)
        cause = rec.envelope.causation_id
        waiter = self._waiting.get(str(cause)) if cause else None
        if waiter is not None and not waiter[1].done():
            if waiter[0](rec):
                waiter[1].set_result(rec)
            elif (progress := self._progress.get(str(cause))) is not None:
                progress(rec)
        for command_id, overtaken in self._watching.get(rec.envelope.aggregate_id, {}).items():
            pending = self._waiting.get(command_id)
            if pending is not None and not pending[1].done() and overtaken(rec):
                pending[1].set_result(rec)
