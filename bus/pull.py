"""The pull loop under every durable consumer of ours (commands and events alike): fetch
one message at a time while fewer than `max_ack_pending` are in flight, settle each in a
task of its own, keep long work alive with `in_progress`, and drain on stop.

What a message's outcome means (ack, nak, term, a rejection) is the wrapper's business
(`bus.consumer`, `bus.event_consumer`); the mechanics of holding a JetStream pull
subscription open and shutting it down without losing a message live here once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from bus.errors import BusError
from bus.failpoints import failpoint
from bus.supervised import supervise

__all__ = ["ConsumerSpec", "PullLoop", "confirm_ack", "kept_alive"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConsumerSpec:
    """The durable consumer's shape. Values are explicit, never the server's defaults."""

    durable: str
    filter_subject: str
    #: Deliveries before JetStream gives up on a message (a command wrapper rejects it on
    #: the last one). Work that must happen eventually (an upload) sets it high; JetStream
    #: before 2.10 refuses -1 (unlimited) beside a backoff list.
    max_deliver: int = 5
    #: Server-side redelivery schedule: delivery n that is neither acked nor heartbeaten
    #: within backoff[n-1] is redelivered (JetStream lets backoff override ack_wait). Also
    #: the nak delay after a `RetryableError` without its own delay.
    backoff: tuple[float, ...] = (5.0, 15.0, 30.0, 60.0)
    #: Ack deadline when `backoff` is empty.
    ack_wait_s: float = 30.0
    #: In-flight messages per consumer across all its workers (the server's limit).
    max_ack_pending: int = 32
    #: In-flight messages in this process (default: `max_ack_pending`). A consumer many
    #: processes share (creates: every node pulls `place`) sets a fleet-wide
    #: `max_ack_pending` and each process its own parallelism.
    parallel: int | None = None
    #: Pull requests the server keeps waiting at once (None: the server's 512) — one per
    #: process pulling, so a fleet of more nodes raises it.
    max_waiting: int | None = None
    #: Messages one fetch asks for. One: nats-py's fetch of n > 1 returns only once n came
    #: or a status closed the pull, and with a long-poll request of an earlier fetch still
    #: open on the server, the command it handed us was held until that request expired
    #: (seen: a resume waiting 0.8 s in the node). Commands are few and slow to handle;
    #: the loop fetches again at once, so one per round trip costs nothing that shows.
    batch: int = 1
    #: How long one fetch waits for messages; bounds how fast `stop()` takes effect.
    fetch_timeout_s: float = 1.0
    #: How long to wait for the server to confirm an ack.
    ack_confirm_timeout_s: float = 2.0
    #: Grace period for in-flight handlers on `stop()`.
    drain_timeout_s: float = 30.0
    #: Where a durable created now starts: None = the stream's first message (a work queue);
    #: else the first message stored at or after this time (a consumer of the event log,
    #: which must not replay all of history when it is first created).
    start_time: datetime | None = None

    def consumer_config(self) -> ConsumerConfig:
        if self.max_deliver <= len(self.backoff):
            raise BusError("max_deliver must exceed the number of backoff steps")
        policy = DeliverPolicy.ALL if self.start_time is None else DeliverPolicy.BY_START_TIME
        return ConsumerConfig(
            durable_name=self.durable,
            filter_subject=self.filter_subject,
            deliver_policy=policy,
            opt_start_time=self.start_time,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_deliver=self.max_deliver,
            backoff=list(self.backoff),
            max_ack_pending=self.max_ack_pending,
            max_waiting=self.max_waiting,
        )

    @property
    def heartbeat_s(self) -> float:
        """`in_progress` period: a third of the shortest ack deadline, so two may be lost."""
        return min((self.ack_wait_s, *self.backoff)) / 3

    def delay(self, attempt: int) -> float:
        """Nak delay after delivery number `attempt` (1-based)."""
        return self.backoff[min(attempt, len(self.backoff)) - 1] if self.backoff else 0.0


class PullLoop:
    """Runs `settle(msg)` for every message of a durable pull consumer until stopped."""

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        spec: ConsumerSpec,
        settle: Callable[[Msg], Awaitable[None]],
        *,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        self._js = js
        #: whether to ask for more now (a node with no room for a sandbox pulls no create:
        #: another node takes it)
        self._ready = ready
        self._stream = stream
        self._spec = spec
        self._settle = settle
        self._sub: JetStreamContext.PullSubscription | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        """Create or update the durable consumer and start pulling."""
        await self._js.add_consumer(self._stream, await self._config())
        self._sub = await self._js.pull_subscribe_bind(self._spec.durable, stream=self._stream)
        # a loop that died would leave the process alive and its queue unread (`supervised`)
        self._loop_task = supervise(f"consumer:{self._spec.durable}", self._run)

    async def _config(self) -> ConsumerConfig:
        """The spec's config — but a durable that exists keeps what JetStream refuses to
        change: where it started (its deliver policy and start time; an event consumer
        asks for "an hour ago" anew at every start) and its `max_waiting` (a `place`
        consumer made by an older aenv keeps the server's default until it is recreated)."""
        config = self._spec.consumer_config()
        try:
            info = await self._js.consumer_info(self._stream, self._spec.durable)
        except NotFoundError:
            return config
        if self._spec.start_time is not None:
            config.deliver_policy = info.config.deliver_policy
            config.opt_start_time = info.config.opt_start_time
            config.opt_start_seq = info.config.opt_start_seq
        if config.max_waiting is not None and info.config.max_waiting != config.max_waiting:
            log.warning(
                "consumer %s keeps max_waiting %s (JetStream cannot change it; "
                "recreate the consumer for %s)",
                self._spec.durable,
                info.config.max_waiting,
                config.max_waiting,
            )
            config.max_waiting = info.config.max_waiting
        return config

    async def stop(self) -> None:
        """Stop fetching, let in-flight handlers settle their messages, unsubscribe."""
        self._stopping.set()
        if self._loop_task is not None:
            await asyncio.wait({self._loop_task})  # one that gave up: its error was logged
            if not self._loop_task.cancelled():
                self._loop_task.exception()
        if self._inflight:
            _, late = await asyncio.wait(self._inflight, timeout=self._spec.drain_timeout_s)
            for task in late:  # their messages are redelivered after ack_wait
                task.cancel()
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def _run(self) -> None:
        assert self._sub is not None
        while not self._stopping.is_set():
            cap = self._spec.parallel or self._spec.max_ack_pending
            free = min(self._spec.batch, cap - len(self._inflight))
            if free <= 0:
                await asyncio.wait(self._inflight, return_when=asyncio.FIRST_COMPLETED)
                continue
            failpoint("consumer.fetch")  # a test's way to kill this loop in a live process
            if self._ready is not None and not self._ready():
                await asyncio.sleep(min(0.1, self._spec.fetch_timeout_s))
                continue
            try:
                msgs = await self._sub.fetch(free, timeout=self._spec.fetch_timeout_s)
            except (NatsTimeoutError, TimeoutError):
                continue
            except Exception as e:  # reconnecting, or the server is restarting
                if self._stopping.is_set():
                    break
                log.warning("fetch on %s failed (%r); retrying", self._spec.durable, e)
                await asyncio.sleep(self._spec.fetch_timeout_s)
                continue
            for msg in msgs:
                task = asyncio.create_task(self._guarded(msg))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)

    async def _guarded(self, msg: Msg) -> None:
        try:
            await self._settle(msg)
        except Exception:
            # Settling itself failed (connection lost, a rejection could not be appended):
            # the message stays unacked and JetStream redelivers it after the ack deadline.
            log.exception("could not settle %s; it will be redelivered", msg.subject)


@contextlib.asynccontextmanager
async def kept_alive(msg: Msg, every_s: float) -> AsyncIterator[None]:
    """`in_progress` every `every_s` while the block runs, so the ack deadline can stay
    short enough to redeliver quickly when a worker dies."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await msg.in_progress()
            except Exception as e:  # the handler's outcome matters more than a lost beat
                log.warning("heartbeat for %s failed: %r", msg.subject, e)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def confirm_ack(msg: Msg, timeout_s: float) -> None:
    """Ack, confirmed by the server (one more round trip, small next to the work a message
    does): when a consumer's `stop()` returns, every finished message is known settled."""
    try:
        await msg.ack_sync(timeout=timeout_s)
    except (NatsTimeoutError, TimeoutError):
        log.warning(
            "ack of %s unconfirmed; it may be redelivered (handlers are idempotent)", msg.subject
        )
