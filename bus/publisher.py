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
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError

__all__ = ["JetStreamPublisher"]

_NO_RESPONDERS = "503"


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
