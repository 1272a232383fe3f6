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
fetching, lets the in-flight handlers finish (bounded), then unsubscribes (`bus.pull`).

One command runs at most once at a time in a process: a redelivery that arrives while an
earlier delivery of the same command is still in this process's hands (its heartbeats were
lost — NATS restarting under the work — so the server took it for dead) waits for that one
to settle, kept alive meanwhile, and then runs, finding the work done or resuming it. Run
beside it, handlers written to redo unfinished work (a fork's children) did it twice, and
the second run's refused completion gave the command a second outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol
from uuid import UUID

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from pydantic import ValidationError

from bus import logcontext
from bus.commands import decode_command
from bus.envelope import CommandEnvelope, MessageContext, decode_command_envelope
from bus.errors import (
    ConcurrencyError,
    DecodeError,
    PermanentError,
    RetryableError,
)
from bus.pull import ConsumerSpec, PullLoop, confirm_ack, kept_alive
from bus.settings import BusSettings
from bus.subjects import Names
from bus.tracing import consume_span
from domain import Command, CommandRejected, CorruptHistory, DomainError, RejectionCode, utcnow

__all__ = ["CommandConsumer", "Delivery", "Handler", "RejectionSink", "record_rejection"]

log = logging.getLogger(__name__)

#: Nak delay after a `ConcurrencyError` escaped the handler: long enough not to spin against
#: the competing writer, short next to any backoff step.
_CONFLICT_RETRY_S = 0.1


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
    def stored_at(self) -> datetime:
        """When JetStream stored the command (its queue time starts there)."""
        return self._msg.metadata.timestamp

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
        *,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        self._spec = spec
        self._handler = handler
        #: by aggregate kind: a template command's rejection lands on the template's subject
        self._rejections = dict(rejections)
        self._loop = PullLoop(
            js, Names(settings.bus_prefix).command_stream, spec, self._handle, ready=ready
        )
        #: commands a delivery of which is being handled here: settled when it is
        self._running: dict[UUID, asyncio.Future[None]] = {}

    async def start(self) -> None:
        """Create or update the durable consumer and start pulling."""
        await self._loop.start()

    async def stop(self) -> None:
        """Stop fetching, let in-flight handlers settle their messages, unsubscribe."""
        await self._loop.stop()

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
        while (earlier := self._running.get(env.command_id)) is not None:
            async with kept_alive(msg, self._spec.heartbeat_s):
                await asyncio.shield(earlier)
        settled = asyncio.get_running_loop().create_future()
        self._running[env.command_id] = settled
        try:
            await self._run(delivery)
        finally:
            del self._running[env.command_id]
            settled.set_result(None)

    async def _run(self, delivery: Delivery) -> None:
        msg, env, attempt = delivery._msg, delivery.envelope, delivery.attempt
        about = {f"{env.kind}_id": env.aggregate_id} if env.kind else {}
        with (
            consume_span(msg.subject, str(env.command_id), msg.headers, self._spec.durable),
            logcontext.bound(**about),
        ):  # every line the handler logs names its aggregate
            try:
                async with kept_alive(msg, self._spec.heartbeat_s):
                    await self._handler(delivery)
            except RetryableError as e:
                await self._retry(delivery, e.delay_s, str(e), e.final_code)
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
                await confirm_ack(msg, self._spec.ack_confirm_timeout_s)

    async def _retry(
        self, d: Delivery, delay: float | None, reason: str, code: RejectionCode = "internal"
    ) -> None:
        if d.last_attempt:
            await self._reject(d, code, f"gave up after {d.attempt} attempts: {reason}")
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
            log.error(
                "rejected %s %s (%s: %s); no store for aggregate kind %r",
                env.type,
                env.command_id,
                code,
                reason,
                env.kind,
            )
            return
        await record_rejection(
            sink, env.aggregate_id, env.command_id, env.type, code, reason, context=context
        )

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


async def record_rejection(
    sink: RejectionSink,
    aggregate_id: str,
    command_id: UUID,
    command_type: str,
    code: RejectionCode,
    reason: str,
    *,
    context: MessageContext,
) -> None:
    """A `CommandRejected` of a command on its aggregate's subject, where whoever sent it
    waits: the consumer wrapper's refusals, and the pipelines' ingress's (`api/ingress.py`)."""
    rejection = CommandRejected(
        aggregate_id=aggregate_id,
        command_id=command_id,
        command_type=command_type,
        code=code,
        reason=reason,
        at=utcnow(),
    )
    await sink.append_rejection(aggregate_id, rejection, context=context)


def _code(code: str) -> RejectionCode:
    known: tuple[RejectionCode, ...] = (
        "not_found",
        "conflict",
        "invalid",
        "permanent",
        "unavailable",
        "internal",
    )
    for k in known:
        if k == code:
            return k
    return "permanent"
