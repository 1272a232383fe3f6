"""The proxy's map of running sandboxes, kept in memory from the nodes' routes bucket.

The API no longer shares a process with the node that runs the VMs, so it learns where a
guest is from the bucket (watched: a lookup costs a dict access, not a round trip) and that
a sandbox went away from the route's deletion (its open streams are then cut at once — a
guest gone with its network namespace never sends a FIN). A route not seen yet (a create
that answered a moment before the watch delivered it) is read from the bucket directly.

A node announces a sandbox running while its route is still on the way (the two are
written side by side, not one after the other): a request for a sandbox that is running,
or being created or resumed, waits a moment for its route. A paused sandbox with
`autoResume` is resumed by the first request that reaches it, as E2B does — through the
resume policy the API hands in (`AutoResume`: the same one its resume route uses, so a
sandbox paused on a node that is gone resumes elsewhere here too); any other miss is E2B's
502 "sandbox was not found".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from bus import Bus
from bus.routes import Route, RouteBook, traffic_digest
from bus.supervised import supervise
from bus.tasks import cancel_and_wait
from domain import sandbox as sb
from domain.sandbox import SandboxStatus
from shared.proxy.ingress import refusal
from shared.proxy.stream import SandboxUnavailable, TrafficRefused, Upstream

log = logging.getLogger(__name__)

__all__ = ["AutoResume", "RouteTable"]

#: Brings a paused sandbox back (returns once it runs; raises if it cannot). The API's
#: resume policy: where the resume goes (its node, or placement when that node is gone and
#: the capture is durable) is its business, not the proxy's.
AutoResume = Callable[[sb.Sandbox], Awaitable[None]]

#: How long a request waits for the route of a sandbox whose state says it runs: the node
#: put it beside the event that announced it, microseconds apart.
ROUTE_GRACE_S = 2.0
RUNNING = (SandboxStatus.RUNNING, SandboxStatus.SNAPSHOTTING, SandboxStatus.FORKING)
#: States whose route comes once the VM is up: a request waits as long as a resume may take.
STARTING = (SandboxStatus.CREATING, SandboxStatus.RESUMING)


class RouteTable:
    def __init__(
        self,
        bus: Bus,
        book: RouteBook,
        *,
        resume_timeout_s: float = 60.0,
        via_node: bool = False,
        resume: AutoResume | None = None,
    ) -> None:
        self.bus = bus
        self.book = book
        #: how a paused sandbox with `autoResume` is brought back; None: it is not
        self.resume = resume
        #: through the node's proxy (any host) rather than straight to the guest address
        #: (reachable only from the node's own host)
        self.via_node = via_node
        self.resume_timeout_s = resume_timeout_s
        self.routes: dict[str, Route] = {}
        #: called with a sandbox id when its route disappears or changes, and the target
        #: (`via`) whose streams may stay: None when it is gone (the proxy cuts its streams)
        self.on_gone: list[Callable[[str, str | None], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._resuming: dict[str, asyncio.Task[None]] = {}
        #: requests waiting for a route to arrive, by sandbox
        self._awaited: dict[str, list[asyncio.Future[Route]]] = {}

    @classmethod
    async def open(
        cls,
        bus: Bus,
        *,
        via_node: bool = False,
        resume: AutoResume | None = None,
        resume_timeout_s: float = 60.0,
    ) -> RouteTable:
        book = await RouteBook.open(bus.js, bus.names.routes_bucket)
        table = cls(bus, book, via_node=via_node, resume=resume, resume_timeout_s=resume_timeout_s)
        # a dead mirror would send traffic by stale routes: restarted (`bus.supervised`)
        table._task = supervise("route-table", table._follow)
        return table

    async def close(self) -> None:
        for task in [self._task, *self._resuming.values()]:
            await cancel_and_wait(task)

    async def resolve(
        self, sandbox_id: str, port: int, traffic_token: str | None = None
    ) -> Upstream:
        """Where a request goes; `traffic_token` is the request's, asked for before a
        private sandbox is auto-resumed (the proxy checks routed requests itself)."""
        route = await self._lookup(sandbox_id)
        if route is None:
            route = await self._missing(sandbox_id, port, traffic_token)
        if self.via_node:
            if route.node_proxy is None:
                raise SandboxUnavailable(sandbox_id)  # a node without a proxy: unreachable
            host, _, node_port = route.node_proxy.rpartition(":")
            routing = (
                (b"e2b-sandbox-id", sandbox_id.encode()),
                (b"e2b-sandbox-port", str(port).encode()),
            )
            # checked here and again by the node's proxy (reachable without us)
            return Upstream(host, int(node_port), routing, route.traffic_digest, self.via(route))
        return Upstream(
            route.address, port, traffic_digest=route.traffic_digest, via=self.via(route)
        )

    def via(self, route: Route) -> str:
        """The target a route sends this table's streams to: the node's proxy, or the guest."""
        if self.via_node:
            return f"node:{route.node_proxy}"
        return f"guest:{route.address}"

    async def _lookup(self, sandbox_id: str) -> Route | None:
        """The mirror, else the bucket (a route the watch has not delivered yet)."""
        return self.routes.get(sandbox_id) or await self.book.get(sandbox_id)

    async def _missing(self, sandbox_id: str, port: int, traffic_token: str | None) -> Route:
        state, _ = await self.bus.sandboxes.load(sandbox_id)
        if state is not None and state.status in (*RUNNING, *STARTING):
            return await self._arrival(state)
        return await self._auto_resume(sandbox_id, state, port, traffic_token)

    async def _arrival(self, state: sb.Sandbox) -> Route:
        """The route of a sandbox that runs (or is being created or resumed), once the watch
        delivers it: within `ROUTE_GRACE_S` of the state saying it runs, or 502."""
        sandbox_id = state.sandbox_id
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Route] = loop.create_future()
        self._awaited.setdefault(sandbox_id, []).append(waiter)
        wait = ROUTE_GRACE_S if state.status in RUNNING else self.resume_timeout_s
        give_up = loop.time() + wait
        try:
            # it may have arrived between the lookups before and the registration
            route = await self._lookup(sandbox_id)
            while route is None:
                left = give_up - loop.time()
                if left <= 0:
                    raise SandboxUnavailable(sandbox_id)
                try:
                    route = await asyncio.wait_for(asyncio.shield(waiter), min(left, 0.5))
                except TimeoutError:  # still starting? (a failed resume never sends a route)
                    fresh, _ = await self.bus.sandboxes.load(sandbox_id)
                    if fresh is None or fresh.status not in (*RUNNING, *STARTING):
                        raise SandboxUnavailable(sandbox_id) from None
                    if fresh.status in RUNNING and state.status not in RUNNING:
                        give_up = min(give_up, loop.time() + ROUTE_GRACE_S)
                    state = fresh
            return route
        finally:
            waiters = self._awaited.get(sandbox_id, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._awaited.pop(sandbox_id, None)

    async def _auto_resume(
        self, sandbox_id: str, state: sb.Sandbox | None, port: int, traffic_token: str | None
    ) -> Route:
        if (
            self.resume is None
            or state is None
            or not state.lifecycle.auto_resume
            or (state.status not in (SandboxStatus.PAUSED, SandboxStatus.PAUSING))
        ):
            raise SandboxUnavailable(sandbox_id)
        # A private sandbox is woken only by a request that may reach it (as E2B's resume).
        token = state.traffic_access_token
        denied = refusal(None if token is None else traffic_digest(token), port, traffic_token)
        if denied is not None:
            raise TrafficRefused(denied)
        # Concurrent requests to one paused sandbox share a single resume.
        task = self._resuming.get(sandbox_id)
        if task is None:
            task = asyncio.create_task(self._resume_within(state))
            self._resuming[sandbox_id] = task
            task.add_done_callback(lambda _: self._resuming.pop(sandbox_id, None))
        try:
            await asyncio.shield(task)
        except Exception as e:  # whatever the policy's reason, the client sees E2B's 502
            log.warning("auto-resume of %s failed: %s", sandbox_id, e)
            raise SandboxUnavailable(sandbox_id) from e
        # the node puts the route beside the event that says it runs: wait for it
        fresh, _ = await self.bus.sandboxes.load(sandbox_id)
        if fresh is None or fresh.status not in RUNNING:
            raise SandboxUnavailable(sandbox_id)
        return await self._arrival(fresh)

    async def _resume_within(self, state: sb.Sandbox) -> None:
        assert self.resume is not None
        await asyncio.wait_for(self.resume(state), self.resume_timeout_s)

    async def _follow(self) -> None:
        """Mirror the bucket for the life of the process (re-watching after a NATS hiccup)."""
        while True:
            try:
                async for sid, route in self.book.watch():
                    if route is None:
                        if self.routes.pop(sid, None) is not None:
                            self._gone(sid, None)
                    else:
                        old = self.routes.get(sid)
                        self.routes[sid] = route
                        for waiter in self._awaited.get(sid, []):
                            if not waiter.done():
                                waiter.set_result(route)
                        if old is not None and old != route:
                            # resumed elsewhere: streams to the old target are dead. The
                            # same target (a pause and resume the watch replayed as one
                            # change, after a NATS restart) keeps its live streams.
                            self._gone(sid, self.via(route))
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("route watch interrupted (%s); re-watching", e)
                # the new watch replays what exists, not what was deleted meanwhile: start
                # from empty (a lookup misses to the bucket until the replay arrives)
                self.routes.clear()
                await asyncio.sleep(0.5)

    def _gone(self, sandbox_id: str, keep_via: str | None) -> None:
        for hook in self.on_gone:
            try:
                hook(sandbox_id, keep_via)
            except Exception:
                log.exception("route on_gone hook failed for %s", sandbox_id)
