"""Where a proxy finds this node's guests: the node's entries in the routes bucket.

A route is put *beside* the append of the event that announces a sandbox running (not
before it: a round trip off every create and resume — the API's proxy waits for the route
of a sandbox it knows running, `shared.proxy.routes`), and dropped when the VM goes (the
host's `on_gone`: pause, kill, close) before the event that says so is appended.
"""

from __future__ import annotations

import asyncio
import logging

from bus import Bus
from bus.publisher import unavailable
from bus.routes import Route, RouteBook, traffic_digest
from workers.node.ports import Host

__all__ = ["RoutePublisher"]

log = logging.getLogger(__name__)

#: How long a route's put is retried while the bucket cannot take it (a NATS server
#: killed, its streams electing leaders): a running sandbox without a route is out of
#: every proxy's reach until a redelivery or its next resume re-puts it.
PUT_BUDGET_S = 30.0


class RoutePublisher:
    def __init__(
        self,
        book: RouteBook,
        host: Host,
        node_id: str,
        node_proxy: str | None,
        *,
        put_budget_s: float = PUT_BUDGET_S,
    ) -> None:
        self.book = book
        self.put_budget_s = put_budget_s
        self.host = host
        self.node_id = node_id
        #: host:port of this node's sandbox proxy, published in every route
        self.node_proxy = node_proxy
        #: the route's `traffic_digest` of each sandbox routed here, for this node's own
        #: proxy (reachable without the API's); absent: not routed (yet), not reachable
        self._ingress: dict[str, str | None] = {}
        self._drops: set[asyncio.Task[None]] = set()
        host.on_gone(self._gone)

    @classmethod
    async def open(
        cls, bus: Bus, host: Host, node_id: str, node_proxy: str | None
    ) -> RoutePublisher:
        return cls(await RouteBook.open(bus.js, bus.names.routes_bucket), host, node_id, node_proxy)

    async def put(self, sandbox_id: str, traffic_token: str | None) -> None:
        """The route of a sandbox running here (its node's proxy and the guest address);
        `traffic_token` is its traffic access token, None when it is public."""
        address = self.host.upstream(sandbox_id)
        if address is not None:
            digest = None if traffic_token is None else traffic_digest(traffic_token)
            self._ingress[sandbox_id] = digest
            route = Route(
                node_id=self.node_id,
                address=address,
                node_proxy=self.node_proxy,
                traffic_digest=digest,
            )
            await self._store(sandbox_id, route)

    async def _store(self, sandbox_id: str, route: Route) -> None:
        """Put `route`, retried while the bucket is unavailable and the VM still runs at
        its address; a VM that went while the put was on its way has its route dropped
        again (its own drop may have reached the bucket first)."""
        loop = asyncio.get_running_loop()
        deadline, delay, tries = loop.time() + self.put_budget_s, 0.1, 0
        while self.host.upstream(sandbox_id) == route.address:
            try:
                await self.book.put(sandbox_id, route)
                break
            except Exception as e:
                if not unavailable(e) or loop.time() + delay > deadline:
                    raise
                tries += 1
                if tries == 1:
                    log.warning("route of %s not stored (%r); retrying", sandbox_id, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        else:
            return  # the VM went: its drop stands
        if tries:
            log.info("route of %s stored after %d retries", sandbox_id, tries)
        if self.host.upstream(sandbox_id) != route.address:
            await self.book.drop(sandbox_id)

    def beside(self, sandbox_id: str, traffic_token: str | None) -> asyncio.Task[None]:
        """`put`, while the caller appends the event that announces the sandbox running."""
        return asyncio.create_task(self.put(sandbox_id, traffic_token), name=f"route:{sandbox_id}")

    def ingress(self, sandbox_id: str) -> tuple[bool, str | None]:
        """(routed here, its route's `traffic_digest`): what this node's proxy checks."""
        return sandbox_id in self._ingress, self._ingress.get(sandbox_id)

    def _gone(self, sandbox_id: str) -> None:
        self._ingress.pop(sandbox_id, None)
        task = asyncio.create_task(self.book.drop(sandbox_id), name=f"unroute:{sandbox_id}")
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    async def dropped(self) -> None:
        """Routes of VMs that went are gone from the bucket (before "paused"/"killed")."""
        if self._drops:
            await asyncio.gather(*self._drops, return_exceptions=True)

    async def sweep(self) -> None:
        """Routes this node published in an earlier life for VMs it no longer runs."""
        for sid, route in (await self.book.all()).items():
            if route.node_id == self.node_id and not self.host.runs(sid):
                await self.book.drop(sid)
