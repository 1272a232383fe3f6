"""Publishing to JetStream with acks matched on one shared reply subscription.

`js.publish` opens a request (new future, timer, response mux) per message; this publisher
keeps one wildcard reply subscription and a dict of futures, which halves the client CPU
per append and lets many appends be in flight at once. (nats-py's own `publish_async`
would do the same, but its reply handler raises instead of failing the future on a
JetStream error, so a "wrong last sequence" would surface as a timeout.)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError

__all__ = ["JetStreamPublisher", "unavailable"]

log = logging.getLogger(__name__)

_NO_RESPONDERS = "503"
#: JetStream's "temporarily unavailable": a stream or the meta layer without a leader
_UNAVAILABLE = 503


def unavailable(e: BaseException) -> bool:
    """Whether a JetStream write failed only because nothing could take it for a while
    (a reconnect, a leader election): worth retrying with the same bytes."""
    if isinstance(e, APIError):
        return e.code == _UNAVAILABLE
    return isinstance(e, (NoStreamResponseError, NoRespondersError, NatsTimeoutError, TimeoutError))


class JetStreamPublisher:
    """`publish(subject, data, headers) -> PubAck`, raising nats-py's `APIError` subclasses."""

    def __init__(self, nc: NATS, timeout: float) -> None:
        self._nc = nc
        self._timeout = timeout
        self._inbox = ""
        self._sub: Subscription | None = None
        self._futures: dict[str, asyncio.Future[PubAck]] = {}
        self._ids = itertools.count()
        self._lock = asyncio.Lock()

    async def _ensure(self) -> None:
        if self._sub is None:
            async with self._lock:
                if self._sub is None:
                    self._inbox = self._nc.new_inbox()
                    self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_reply)

    async def publish(
        self, subject: str, data: bytes, headers: dict[str, str], timeout: float | None = None
    ) -> PubAck:
        await self._ensure()
        token = str(next(self._ids))
        future: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        self._futures[token] = future
        try:
            await self._nc.publish(subject, data, reply=f"{self._inbox}.{token}", headers=headers)
            return await asyncio.wait_for(future, timeout or self._timeout)
        finally:
            self._futures.pop(token, None)

    async def publish_stored(
        self, subject: str, data: bytes, headers: dict[str, str], *, budget_s: float
    ) -> tuple[PubAck, bool]:
        """The ack once JetStream stored the message, and whether an earlier attempt may
        have stored it already (a duplicate in the ack is then ours).

        Retried — the same bytes, the same `Nats-Msg-Id`, so at most one copy is stored —
        while nothing can take it for a while: the client reconnecting to another server,
        or a cluster electing the stream's leader (no responders, or JetStream's 503).
        `budget_s` bounds the whole; what else JetStream refuses raises at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        delay, attempt = 0.05, 0
        while True:
            try:
                return await self.publish(subject, data, headers), attempt > 0
            except Exception as e:
                if not unavailable(e) or loop.time() + delay > deadline:
                    raise
                why = e
            attempt += 1
            if attempt == 1:
                log.info("publish to %s not stored yet (%r); retrying", subject, why)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _on_reply(self, msg: Msg) -> None:
        future = self._futures.get(msg.subject.rsplit(".", 1)[-1])
        if future is None or future.done():
            return  # the publisher gave up (timeout) before the ack came
        if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            future.set_exception(NoStreamResponseError())
            return
        try:
            resp: dict[str, Any] = json.loads(msg.data)
        except ValueError as e:
            future.set_exception(APIError(description=f"unreadable ack: {e}"))
            return
        if "error" in resp:
            err = resp["error"]
            future.set_exception(
                APIError(
                    code=err.get("code"),
                    err_code=err.get("err_code"),
                    description=err.get("description"),
                )
            )
        else:
            future.set_result(PubAck.from_response(resp))

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
