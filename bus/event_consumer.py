"""The consumer wrapper for workers that act on what happened (rule 8, the twin of
`bus.consumer` for the event log): a durable pull consumer of AENV_EVT whose handler's
outcome decides the ack.

    success                          → ack
    RetryableError                   → nak(delay)   (delay: the error's, else the backoff)
    PermanentError / undecodable     → term, logged (an event is not refused: nobody waits)
    any other exception              → nak along the backoff (retried while JetStream
                                       delivers it: `max_deliver`)

The snapshot worker is its first user: a `SandboxPaused` is acked once the capture is
durable (or moot), so an upload cut short by a crash is simply delivered again — the log is
the to-do list, not a journal of our own. Long handlers are kept alive with `in_progress`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from pydantic import ValidationError

from bus import logcontext
from bus.errors import DecodeError, PermanentError, RetryableError
from bus.feed import recorded
from bus.pull import ConsumerSpec, PullLoop, confirm_ack, kept_alive
from bus.records import RecordedEvent
from bus.settings import BusSettings
from bus.subjects import Names
from bus.tracing import consume_span

__all__ = ["EventConsumer", "EventDelivery", "EventHandler"]

log = logging.getLogger(__name__)


@dataclass
class EventDelivery:
    """One stored event handed to a handler, with its delivery metadata."""

    record: RecordedEvent
    attempt: int
    _msg: Msg = field(repr=False)

    @property
    def age_s(self) -> float:
        """Seconds since the event happened (by the deciding command's clock)."""
        return (datetime.now(UTC) - self.record.envelope.occurred_at).total_seconds()


EventHandler = Callable[[EventDelivery], Awaitable[None]]


class EventConsumer:
    """Runs `handler` over a durable pull consumer of AENV_EVT until stopped."""

    def __init__(
        self,
        js: JetStreamContext,
        settings: BusSettings,
        spec: ConsumerSpec,
        handler: EventHandler,
    ) -> None:
        self._spec = spec
        self._handler = handler
        self._loop = PullLoop(js, Names(settings.bus_prefix).event_stream, spec, self._handle)

    async def start(self) -> None:
        await self._loop.start()

    async def stop(self) -> None:
        """Stop fetching, let in-flight handlers settle their events, unsubscribe."""
        await self._loop.stop()

    async def _handle(self, msg: Msg) -> None:
        attempt = msg.metadata.num_delivered
        try:
            rec = recorded(msg)
        except (DecodeError, ValidationError) as e:
            log.error("terminating an undecodable event on %s: %s", msg.subject, e)
            await msg.term()
            return
        delivery = EventDelivery(rec, attempt, msg)
        env = rec.envelope
        about = {f"{Names.kind_of(msg.subject)}_id": env.aggregate_id}
        with (
            consume_span(msg.subject, str(env.event_id), msg.headers, self._spec.durable),
            logcontext.bound(**about),
        ):  # every line the handler logs names its aggregate
            try:
                async with kept_alive(msg, self._spec.heartbeat_s):
                    await self._handler(delivery)
            except RetryableError as e:
                await msg.nak(delay=self._spec.delay(attempt) if e.delay_s is None else e.delay_s)
            except PermanentError as e:
                log.error("%s on %s: giving up (%s)", rec.envelope.type, msg.subject, e)
                await msg.term()
            except Exception as e:
                delay = self._spec.delay(attempt)
                log.warning(
                    "%s on %s failed (attempt %d, again in %.0f s): %s",
                    rec.envelope.type,
                    msg.subject,
                    attempt,
                    delay,
                    e,
                )
                await msg.nak(delay=delay)
            else:
                await confirm_ack(msg, self._spec.ack_confirm_timeout_s)
