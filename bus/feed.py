"""Reading the event stream in order from a sequence: projections, rebuilds, waiters.

An ordered consumer (ephemeral, no acks, flow-controlled; the client recreates it from the
last seen sequence if a gap appears) is JetStream's tool for replaying a stream fast.
Messages are handed out in batches so that a projection can apply many per transaction.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from bus.envelope import decode_event
from bus.records import RecordedEvent
from bus.settings import BusSettings
from bus.subjects import Names

__all__ = ["ORDERED_HEARTBEAT_S", "EventFeed", "recorded", "stream_last_seq"]

#: Idle heartbeat of our ordered consumers. nats-py recreates one after two missed beats;
#: with its default (5 s, checked every 10 s) the first answers after a NATS restart came
#: 15-20 s late — an API's kill waited that long for the event it had caused.
ORDERED_HEARTBEAT_S = 1.0


async def stream_last_seq(js: JetStreamContext, settings: BusSettings) -> int:
    """The event stream's last sequence: how far a replay must go to be caught up."""
    info = await js.stream_info(Names(settings.bus_prefix).event_stream)
    return info.state.last_seq


class EventFeed:
    """Events matching `filter_subject` from `start_seq` on, as decoded batches.

    Use as an async context manager; `next_batch()` waits up to `timeout` for the first
    event, then takes whatever else is already buffered, up to `max_batch`.
    """

    def __init__(
        self,
        js: JetStreamContext,
        settings: BusSettings,
        filter_subject: str,
        *,
        start_seq: int = 1,
        max_batch: int = 500,
    ) -> None:
        self._js = js
        self._stream = Names(settings.bus_prefix).event_stream
        self._filter = filter_subject
        self._start = max(1, start_seq)
        self._max_batch = max_batch
        # Bounded: a full queue blocks the subscription callback, which delays the flow-control
        # replies, which pauses the server. Replaying a huge stream stays in bounded memory.
        self._queue: asyncio.Queue[Msg] = asyncio.Queue(maxsize=4 * max_batch)
        self._sub: JetStreamContext.PushSubscription | None = None
        #: Matching messages the server has not delivered yet (None until known).
        self._pending: int | None = None
        #: Consumer sequence (count of deliveries) the server had reached when we asked, and
        #: the last one received: deliveries still in the socket mean "not caught up".
        self._delivered = 0
        self._received = 0

    async def _on_msg(self, msg: Msg) -> None:
        self._pending = msg.metadata.num_pending
        self._received = msg.metadata.sequence.consumer
        await self._queue.put(msg)

    async def behind(self) -> int:
        """Matching events not handed out yet: what the server has not delivered (asked
        now) and what arrived but waits in this feed's buffer."""
        if self._sub is None:
            raise RuntimeError("the feed is not open")
        info = await self._sub.consumer_info()
        return (info.num_pending or 0) + self._queue.qsize()

    def caught_up(self) -> bool:
        """True when every message that matched when last heard from has been handed out."""
        return self._pending == 0 and self._received >= self._delivered and self._queue.empty()

    async def __aenter__(self) -> EventFeed:
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self._start,
        )
        self._sub = await self._js.subscribe(
            self._filter,
            stream=self._stream,
            cb=self._on_msg,
            ordered_consumer=True,
            idle_heartbeat=ORDERED_HEARTBEAT_S,
            config=config,
        )
        info = await self._sub.consumer_info()
        self._delivered = info.delivered.consumer_seq if info.delivered else 0
        if self._queue.empty():  # otherwise the deliveries already told us, more recently
            self._pending = info.num_pending
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def next_batch(self, timeout: float = 1.0, linger: float = 0.0) -> list[RecordedEvent]:
        """The next events in stream order; [] if none arrived within `timeout`.

        After the first event, waits up to `linger` seconds for the batch to fill: under a
        steady trickle, fewer and larger batches cost far less than one per event.
        """
        try:
            first = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return []
        msgs = [first]
        deadline = asyncio.get_running_loop().time() + linger
        while len(msgs) < self._max_batch:
            if self._queue.empty():
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0 or self.caught_up():
                    break
                await asyncio.sleep(min(left, 0.002))
                continue
            msgs.append(self._queue.get_nowait())
        return [recorded(m) for m in msgs]


def recorded(msg: Msg) -> RecordedEvent:
    """A stream delivery, decoded, with its stream sequence and headers."""
    env, event = decode_event(msg.data)
    return RecordedEvent(
        seq=msg.metadata.sequence.stream,
        subject=msg.subject,
        envelope=env,
        event=event,
        headers=msg.headers,
    )
