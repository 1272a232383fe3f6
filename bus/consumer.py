"""The one consumer wrapper (rule 8): a durable pull consumer whose handler's outcome decides
the ack.

    success                          → ack
    RetryableError                   → nak(delay)   (delay: the error's, else the backoff)
    ConcurrencyError                 → nak(0.1 s)   (decide again on the fresh state)
    DomainError / PermanentError /
    undecodable or invalid message   → term + CommandRejected on the subject of the aggregate
                                       the command addresses (its envelope's kind)
    any other exception              → retried like RetryableError; on the last allowed
                                       delivery → term + CommandRejected("internal")

Long handlers get `in_progress` heartbeats automatically (a third of the ack deadline), so
the deadline can stay short enough to redeliver quickly when a worker dies. `stop()` stops
fetching, lets the in-flight handlers finish (bounded), then unsubscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from bus.commands import decode_command
from bus.envelope import CommandEnvelope, MessageContext, decode_command_envelope
from bus.errors import (
    BusError,
    ConcurrencyError,
    DecodeError,
    PermanentError,
    RetryableError,
)
from bus.settings import BusSettings
from bus.subjects import Names
from bus.tracing import consume_span
from domain import Command, CommandRejected, CorruptHistory, DomainError, RejectionCode, utcnow

__all__ = ["CommandConsumer", "ConsumerSpec", "Delivery", "Handler", "RejectionSink"]

log = logging.getLogger(__name__)

#: Nak delay after a `ConcurrencyError` escaped the handler: long enough not to spin against
#: the competing writer, short next to any backoff step.
_CONFLICT_RETRY_S = 0.1


@dataclass(frozen=True)
class ConsumerSpec:
    """The durable consumer's shape. Values are explicit, never the server's defaults."""

    durable: str
    filter_subject: str
    #: Deliveries before JetStream gives up on a message (we reject it on the last one).
    max_deliver: int = 5
    #: Server-side redelivery schedule: delivery n that is neither acked nor heartbeaten
    #: within backoff[n-1] is redelivered (JetStream lets backoff override ack_wait). Also
    #: the nak delay after a `RetryableError` without its own delay.
    backoff: tuple[float, ...] = (5.0, 15.0, 30.0, 60.0)
    #: Ack deadline when `backoff` is empty.
    ack_wait_s: float = 30.0
    #: In-flight messages per consumer across all its workers: the node's parallelism cap.
    max_ack_pending: int = 32
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

    def consumer_config(self) -> ConsumerConfig:
        if self.max_deliver <= len(self.backoff):
            raise BusError("max_deliver must exceed the number of backoff steps")
        return ConsumerConfig(
            durable_name=self.durable,
            filter_subject=self.filter_subject,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_deliver=self.max_deliver,
            backoff=list(self.backoff),
            max_ack_pending=self.max_ack_pending,
        )

    @property
    def heartbeat_s(self) -> float:
        """`in_progress` period: a third of the shortest ack deadline, so two may be lost."""
        return min((self.ack_wait_s, *self.backoff)) / 3

    def delay(self, attempt: int) -> float:
        """Nak delay after delivery number `attempt` (1-based)."""
        return self.backoff[min(attempt, len(self.backoff)) - 1] if self.backoff else 0.0


@dataclass
class Delivery:
    """One command handed to a handler, with its delivery metadata."""

    envelope: CommandEnvelope
    command: Command
    subject: str
    stream_seq: int
    attempt: int
    last_attempt: bool
    _msg: Msg = field(repr=False)

    @property
    def context(self) -> MessageContext:
        """The context to append the command's events with (causation = this command)."""
        return MessageContext.caused_by(self.envelope)

    async def heartbeat(self) -> None:
        """Tell JetStream we are still working (the wrapper also does this periodically)."""
        await self._msg.in_progress()


Handler = Callable[[Delivery], Awaitable[None]]


class RejectionSink(Protocol):
    """Where rejections of one aggregate kind go: its own subjects (an `EventStore`)."""

    async def append_rejection(
        self, aggregate_id: str, rejection: CommandRejected, *, context: MessageContext
    ) -> object: ...


class CommandConsumer:
    """Runs `handler` over a durable pull consumer of AENV_CMD until stopped."""

    def __init__(
        self,
        js: JetStreamContext,
        settings: BusSettings,
        spec: ConsumerSpec,
        handler: Handler,
        rejections: Mapping[str, RejectionSink],
    ) -> None:
        self._js = js
        self._stream = Names(settings.bus_prefix).command_stream
        self._spec = spec
        self._handler = handler
        #: by aggregate kind: a template command's rejection lands on the template's subject
        self._rejections = dict(rejections)
        self._sub: JetStreamContext.PullSubscription | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        """Create or update the durable consumer and start pulling."""
        await self._js.add_consumer(self._stream, self._spec.consumer_config())
        self._sub = await self._js.pull_subscribe_bind(self._spec.durable, stream=self._stream)
        self._loop_task = asyncio.create_task(self._run(), name=f"consumer:{self._spec.durable}")

    async def stop(self) -> None:
        """Stop fetching, let in-flight handlers settle their messages, unsubscribe."""
        self._stopping.set()
        if self._loop_task is not None:
            await self._loop_task
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
            free = min(self._spec.batch, self._spec.max_ack_pending - len(self._inflight))
            if free <= 0:
                await asyncio.wait(self._inflight, return_when=asyncio.FIRST_COMPLETED)
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
                task = asyncio.create_task(self._settle(msg))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)

    async def _settle(self, msg: Msg) -> None:
        try:
            await self._handle(msg)
        except Exception:
            # Settling itself failed (connection lost, the rejection could not be appended):
            # the message stays unacked and JetStream redelivers it after the ack deadline.
            log.exception("could not settle %s; it will be redelivered", msg.subject)

    async def _handle(self, msg: Msg) -> None:
        meta = msg.metadata
        attempt = meta.num_delivered
        last = attempt >= self._spec.max_deliver
        try:
            env, command = decode_command(msg.data)
        except (DecodeError, ValidationError) as e:
            await self._reject_raw(msg, "invalid", str(e))
            return
        delivery = Delivery(env, command, msg.subject, meta.sequence.stream, attempt, last, msg)
        with consume_span(msg.subject, str(env.command_id), msg.headers, self._spec.durable):
            beat = asyncio.create_task(self._heartbeat(msg))
            try:
                await self._handler(delivery)
            except RetryableError as e:
                await self._retry(delivery, e.delay_s, str(e))
            except ConcurrencyError as e:
                # Another writer moved the aggregate on: deciding again on fresh state will
                # settle it, so retry soon rather than along the backoff.
                await self._retry(delivery, _CONFLICT_RETRY_S, str(e))
            except PermanentError as e:
                await self._reject(delivery, _code(e.code), str(e))
            except CorruptHistory as e:
                await self._reject(delivery, "internal", str(e))
            except DomainError as e:
                await self._reject(delivery, _code(e.code), e.message)
            except (DecodeError, ValidationError) as e:
                await self._reject(delivery, "invalid", str(e))
            except Exception as e:
                log.exception("handler failed on %s (attempt %d)", msg.subject, attempt)
                await self._retry(delivery, None, f"{type(e).__name__}: {e}")
            else:
                await self._ack(msg)
            finally:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat

    async def _ack(self, msg: Msg) -> None:
        # Acks are confirmed by the server (one more round trip, small next to the work a
        # command does): when `stop()` returns, every finished command is known settled.
        try:
            await msg.ack_sync(timeout=self._spec.ack_confirm_timeout_s)
        except (NatsTimeoutError, TimeoutError):
            log.warning(
                "ack of %s unconfirmed; it may be redelivered (handlers are idempotent)",
                msg.subject,
            )

    async def _heartbeat(self, msg: Msg) -> None:
        while True:
            await asyncio.sleep(self._spec.heartbeat_s)
            try:
                await msg.in_progress()
            except Exception as e:  # the handler's outcome matters more than a lost beat
                log.warning("heartbeat for %s failed: %r", msg.subject, e)

    async def _retry(self, d: Delivery, delay: float | None, reason: str) -> None:
        if d.last_attempt:
            await self._reject(d, "internal", f"gave up after {d.attempt} attempts: {reason}")
            return
        await d._msg.nak(delay=self._spec.delay(d.attempt) if delay is None else delay)

    async def _reject(self, d: Delivery, code: RejectionCode, reason: str) -> None:
        await self._record_rejection(d.envelope, code, reason, d.context)
        await d._msg.term()

    async def _record_rejection(
        self, env: CommandEnvelope, code: RejectionCode, reason: str, context: MessageContext
    ) -> None:
        """A `CommandRejected` on the addressed aggregate's subject; logged instead when the
        envelope names a kind this process keeps no store for (nobody could wait there)."""
        sink = self._rejections.get(env.kind or "")
        if sink is None:
            log.error("rejected %s %s (%s: %s); no store for aggregate kind %r", env.type,
                      env.command_id, code, reason, env.kind)  # fmt: skip
            return
        rejection = CommandRejected(
            aggregate_id=env.aggregate_id,
            command_id=env.command_id,
            command_type=env.type,
            code=code,
            reason=reason,
            at=utcnow(),
        )
        await sink.append_rejection(env.aggregate_id, rejection, context=context)

    async def _reject_raw(self, msg: Msg, code: RejectionCode, reason: str) -> None:
        """A message we cannot fully decode: reject on its aggregate if the envelope says which."""
        try:
            env = decode_command_envelope(msg.data)
        except DecodeError:
            log.error("terminating an undecodable command on %s: %s", msg.subject, reason)
            await msg.term()
            return
        await self._record_rejection(env, code, reason, MessageContext.caused_by(env))
        await msg.term()


def _code(code: str) -> RejectionCode:
    known: tuple[RejectionCode, ...] = ("not_found", "conflict", "invalid", "permanent", "internal")
    for k in known:
        if k == code:
            return k
    return "permanent"
