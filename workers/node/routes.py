"""Where a proxy finds this node's guests: the node's entries in the routes bucket.

A route is put *beside* the append of the event that announces a sandbox running (not
before it: a round trip off every create and resume — the API's proxy waits for the route
of a sandbox it knows running, `shared.proxy.routes`), and dropped when the VM goes (the
host's `on_gone`: pause, kill, close) before the event that says so is appended.
"""

from __future__ import annotations

import asyncio

from bus import Bus
from bus.routes import Route, RouteBook
from workers.node.ports import Host

__all__ = ["RoutePublisher"]


class RoutePublisher:
    def __init__(self, book: RouteBook, host: Host, node_id: str, node_proxy: str | None) -> None:
        self.book = book
        self.host = host
        self.node_id = node_id
        #: host:port of this node's sandbox proxy, published in every route
        self.node_proxy = node_proxy
        self._drops: set[asyncio.Task[None]] = set()
        host.on_gone(self._gone)

    @classmethod
    async def open(cls, bus: Bus, host: Host, node_id: str, node_proxy: str | None
                   ) -> RoutePublisher:  # fmt: skip
        return cls(await RouteBook.open(bus.js, bus.names.routes_bucket), host, node_id,
                   node_proxy)  # fmt: skip

    async def put(self, sandbox_id: str) -> None:
        """The route of a sandbox running here (its node's proxy and the guest address)."""
        address = self.host.upstream(sandbox_id)
        if address is not None:
            route = Route(node_id=self.node_id, address=address, node_proxy=self.node_proxy)
            await self.book.put(sandbox_id, route)

    def beside(self, sandbox_id: str) -> asyncio.Task[None]:
        """`put`, while the caller appends the event that announces the sandbox running."""
        return asyncio.create_task(self.put(sandbox_id), name=f"route:{sandbox_id}")

    def _gone(self, sandbox_id: str) -> None:
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
