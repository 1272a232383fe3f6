"""Where each running sandbox can be reached: a KV bucket written by nodes, read by proxies.

Not events: an address is a fact about a live VM (it changes with every resume and dies with
the node), so it lives next to the heartbeats rather than in the log. Nodes put a route
before they announce a sandbox as running and drop it before they announce it gone, so any
API process — the one beside the node or another one — can proxy to it.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, ValidationError

from bus.kvwatch import kv_entries

__all__ = ["Route", "RouteBook", "traffic_digest"]


class Route(BaseModel):
    """The node that runs a sandbox, the host-side address of its guest (reachable from
    that node's host), and the node's proxy (`host:port`, reachable from any API)."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    address: str
    node_proxy: str | None = None
    #: `traffic_digest` of the sandbox's traffic access token when it is closed to public
    #: traffic (the proxy then asks for it on guest ports); None: public. A digest, not the
    #: token: anything on the bus may read this bucket, and it only needs to compare.
    traffic_digest: str | None = None


def traffic_digest(token: str) -> str:
    """What a route keeps of a traffic access token, and what a proxy compares it with."""
    return hashlib.sha256(token.encode()).hexdigest()


class RouteBook:
    """Typed access to the routes bucket (one key per sandbox)."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext, bucket: str) -> RouteBook:
        return cls(await js.key_value(bucket))

    async def put(self, sandbox_id: str, route: Route) -> None:
        await self.kv.put(sandbox_id, route.model_dump_json().encode())

    async def drop(self, sandbox_id: str) -> None:
        with contextlib.suppress(KeyNotFoundError):
            await self.kv.delete(sandbox_id)

    async def get(self, sandbox_id: str) -> Route | None:
        try:
            entry = await self.kv.get(sandbox_id)
        except KeyNotFoundError:
            return None
        return _decode(entry.value)

    async def all(self) -> dict[str, Route]:
        """Every route now (a node's start-up sweep of routes its previous life left)."""
        out: dict[str, Route] = {}
        async for sid, route in self._entries(initial_only=True):
            if route is not None:
                out[sid] = route
        return out

    async def watch(self) -> AsyncIterator[tuple[str, Route | None]]:
        """Current routes, then every change as it happens; None = the route is gone."""
        async for item in self._entries(initial_only=False):
            yield item

    async def _entries(self, *, initial_only: bool) -> AsyncIterator[tuple[str, Route | None]]:
        async with contextlib.aclosing(kv_entries(self.kv, _decode)) as entries:
            async for item in entries:
                if item is None:  # end of the initial values
                    if initial_only:
                        return
                    continue
                yield item


def _decode(raw: bytes | None) -> Route | None:
    if not raw:
        return None
    try:
        return Route.model_validate_json(raw)
    except ValidationError:
        return None  # a foreign or older writer's value: treat as no route
