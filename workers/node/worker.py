"""The node worker: consumes this node's commands and placement creates, drives its `Host`
(the VM port: QEMU microVMs, or memory in the VM-less tier), and appends the outcomes.

Every sandbox handler has one shape (`_operate`): decide the request on the aggregate
(append its `*Requested` event), do the host's work, then decide the matching `Complete*`
command (append the outcome). Completion command ids derive from the request's, so a
redelivered request completes once. Creates and resumes share a longer skeleton of their
own, run on data (`openings.py`, `verbs.py`): capacity, an early start (the VM starts while
the decision is appended: `early.py`), redeliveries; a fork (`forks.py`) decides each
child's create on the child's own stream.

Routes, the restart reconcile and the heartbeat are modules of their own; uploads are the
snapshot worker's.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from functools import partial

from bus import (
    Bus,
    CommandConsumer,
    ConsumerSpec,
    Delivery,
    MessageContext,
    PermanentError,
    RetryableError,
)
from bus.decisions import execute
from bus.diskroom import fits_disk
from bus.supervised import supervise
from bus.tasks import cancel_and_wait
from domain import Invalid, NotFound
from domain import sandbox as sb
from domain import template as tp
from domain.sandbox import SandboxStatus as S
from workers.node.capacity import Size, ledger_of
from workers.node.completions import completion_id
from workers.node.cordon import CordonWatch
from workers.node.disk import image_cache_dir
from workers.node.disk.node import NodeDisk
from workers.node.forks import fork
from workers.node.heartbeat import beat_forever
from workers.node.image.leftovers import finish_interrupted
from workers.node.journal import Journal
from workers.node.metrics import NodeMetrics
from workers.node.net.firewall import EgressPolicy
from workers.node.network import update_network
from workers.node.openings import Openings
from workers.node.ports import GuestConfig, GuestVolume, Host, HostError, TemplateLocation
from workers.node.reconcile import reconcile
from workers.node.routes import RoutePublisher
from workers.node.settings import NodeSettings
from workers.node.template_work import import_template, locate_template
from workers.node.warmsize import passes_on

__all__ = ["NodeWorker", "completion_id", "egress_of"]

log = logging.getLogger(__name__)

#: Creates in flight across the whole fleet, and nodes pulling at once: the shared `place`
#: consumer's server-side limits (with JetStream's defaults, 32 creates and 512 nodes).
PLACE_IN_FLIGHT = 100_000
PLACE_PULLERS = 10_000

#: What a handler's host work hands back: the completion to decide.
Work = Callable[[sb.Sandbox], Awaitable[sb.AnySandboxCommand]]


def egress_of(net: sb.NetworkPolicy, enabled: bool) -> EgressPolicy:
    return EgressPolicy(
        internet=net.allow_internet_access and enabled,
        allow=net.allow_out if enabled else (),
        deny=net.deny_out,
    )


class NodeWorker:
    def __init__(
        self,
        bus: Bus,
        host: Host,
        settings: NodeSettings,
        *,
        node_proxy: str | None = None,
        on_moot: Callable[[str], None] | None = None,
        uploads_waiting: Callable[[], tuple[int, float]] | None = None,
        on_killed: Callable[[str], None] | None = None,
        metrics: NodeMetrics | None = None,
        disk: NodeDisk | None = None,
    ) -> None:
        self.bus = bus
        self.host = host
        self.settings = settings
        self.node_id = settings.node_id
        #: host:port of this node's sandbox proxy, published in every route
        self.node_proxy = node_proxy
        #: told a sandbox's paused capture is moot (resumed or killed): its upload stops
        self.on_moot = on_moot or (lambda _: None)
        #: the snapshot worker's failed-upload backlog, reported in the heartbeat
        self.uploads_waiting = uploads_waiting
        #: told a sandbox was killed here (what was observed of it goes)
        self.on_killed = on_killed or (lambda _: None)
        self.journal = Journal(settings.state_dir / "journal")
        #: the room this node has left: a create is pulled only while it fits
        self.capacity = ledger_of(settings)
        #: what a typical create asks (the base template): no room for it, no pulling
        self._typical = Size(settings.base_vcpus, settings.base_mem_mib)
        host.on_gone(self.capacity.release)
        self.routes: RoutePublisher | None = None
        self._consumers: list[CommandConsumer] = []
        self._heartbeat: asyncio.Task[None] | None = None
        #: what its data dirs hold, walked every minute, under one budget (images-at-scale
        #: S8; a memory host builds no images)
        images = image_cache_dir() if settings.node_host == "qemu" else None
        self._image_cache = images
        self.node_disk = disk or NodeDisk(settings, images)
        self.disk = self.node_disk.usage
        #: the node's disk budget: `make_room(nbytes)` for whoever finds the disk full
        self.disk_budget = self.node_disk.budget
        self._disk_walks: asyncio.Task[None] | None = None
        #: reconciled and pulling commands (the node's readiness)
        self.serving = False
        host.set_template_locator(self._locate_template)
        host.on_died(self._vm_died)
        #: the node's series (`metrics.py`): stages timed here and by the host
        self.metrics = metrics or NodeMetrics(self.node_id)
        host.on_stage(self.metrics.stage)
        #: an operator's cordon (`aenv node cordon`): no placed creates or resumes, no warm VMs
        self.cordon = CordonWatch(bus, self.node_id)
        #: creates and resumes: one skeleton, two verbs
        self.openings = Openings(
            self,
            self._typical,
            on_moot=lambda sid: self.on_moot(sid),
            kill=self._kill,
            disk_room=self.node_disk.room,
            disk_headroom=settings.disk_headroom_bytes,
            disk_changed=self.node_disk.changed,
        )

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        restored = self.host.reload_templates()
        if restored:
            log.info("re-adopted %d snapshot templates", restored)
        self.routes = await RoutePublisher.open(self.bus, self.host, self.node_id, self.node_proxy)
        parts = (self.bus.sandboxes, self.host, self.journal, self.node_id)
        await reconcile(*parts, self.guest_config, self._kill_lost, self._paused_again)
        swept = await self.host.sweep_leftovers()
        if swept:
            log.info("removed %d directories left by a crash", swept)
        if self._image_cache is not None and self._image_cache.is_dir():
            # an import's tidy or cleanup a kill cut short: the rest goes before any import
            await asyncio.to_thread(finish_interrupted, self._image_cache)
        await self.routes.sweep()
        await self.cordon.refresh()  # before any pull: a node restarted cordoned takes nothing
        names = self.bus.names
        specs = [
            ConsumerSpec(
                durable=names.node_consumer(self.node_id),
                filter_subject=names.node_commands(self.node_id),
            ),
            # shared by every node: its limits are the fleet's, the parallelism this node's
            ConsumerSpec(
                durable=names.place_consumer,
                filter_subject=names.place_commands,
                max_ack_pending=PLACE_IN_FLIGHT,
                max_waiting=PLACE_PULLERS,
                parallel=max(1, self.settings.capacity),
            ),
        ]
        gates = [None, self._takes_creates]
        for spec, gate in zip(specs, gates, strict=True):
            c = CommandConsumer(
                self.bus.js,
                self.bus.settings,
                spec,
                self.handle,
                self.bus.rejection_sinks,
                ready=gate,
            )
            await c.start()
            self._consumers.append(c)
        beats = partial(
            beat_forever,
            self.bus,
            self.host,
            self.node_id,
            self.settings.heartbeat_s,
            self.capacity.room,
            self.uploads_waiting,
            proxy=self.node_proxy,
            disk_used=self.node_disk.used,
            disk_budget=lambda: self.disk_budget.budget,
            disk_room=self.node_disk.room,
            disk_pinned=self.node_disk.pinned,
            cordoned=lambda: self.cordon.cordoned,
            nudge=self.cordon.changed,
        )
        # a dead heartbeat: the fleet takes this live node for gone (`bus.supervised`)
        self._heartbeat = supervise("heartbeat", beats)
        self.cordon.start()
        self._disk_walks = supervise("disk-walk", self.node_disk.run_forever)
        # warm VMs live in the room the sandboxes leave: given up first when they need it
        self.host.start_warm_pool(self.cordon.spare(lambda: self.capacity.room().free_mem_mib))
        self.serving = True

    def _takes_creates(self) -> bool:
        """Whether it pulls placed creates now: a typical sandbox fits its memory and vCPUs,
        and its disk has room for at least the headroom every create keeps (short of that
        it could take none: pulling would only nak them, `openings.py::_disk_to_create`)."""
        room = self.node_disk.room()
        return (
            not self.cordon.cordoned
            and self.capacity.fits(self._typical)
            and fits_disk(room, self.settings.disk_headroom_bytes)
        )

    async def stop(self) -> None:
        """Stop taking work and let in-flight commands finish (the consumers drain them)."""
        self.serving = False
        for c in self._consumers:
            await c.stop()
        # its KV put is a nats-py request, whose wait_for can swallow one cancel
        await cancel_and_wait(self._heartbeat)
        await cancel_and_wait(self._disk_walks)
        await self.cordon.stop()

    def guest_config(self, state: sb.Sandbox | sb.CreateSandbox) -> GuestConfig:
        """What envd is told: from a sandbox's state, or from a fork child's create."""
        return GuestConfig(
            env_vars=dict(state.env_vars),
            access_token=state.envd_access_token,
            egress=egress_of(state.network, self.settings.egress_enabled),
            volumes=tuple(GuestVolume(m.volume_id, m.name, m.path) for m in state.volume_mounts),
            ended_keep=(self.settings.envd_ended_keep, self.settings.envd_ended_keep_s),
            copy_on_write=isinstance(state, sb.CreateSandbox) and state.copy_on_write,
        )

    def ingress(self, sandbox_id: str) -> tuple[bool, str | None]:
        """Who may reach a sandbox's guest ports, for this node's proxy (none before start)."""
        return self.routes.ingress(sandbox_id) if self.routes is not None else (False, None)

    @property
    def route_publisher(self) -> RoutePublisher:
        assert self.routes is not None, "start() first"
        return self.routes

    # ---- dispatch --------------------------------------------------------------------
    async def handle(self, d: Delivery) -> None:
        with self.metrics.operation(d.command, d.stored_at, self.host.started_warm):
            await self._dispatch(d)

    async def _dispatch(self, d: Delivery) -> None:
        cmd, ctx = d.command, d.context
        self.cordon.pass_on(d)  # a create or resume pulled just before a cordon
        match cmd:
            case sb.CreateSandbox():
                if d.attempt == 1 and (why := self._better_elsewhere(cmd)) is not None:
                    raise RetryableError(why, delay_s=0)
                await self.openings.create(cmd, ctx)
            case sb.ResumeSandbox():
                await self.openings.resume(cmd, ctx)
            case sb.PauseSandbox():
                defaults = await self._flushed(cmd)
                await self._operate(cmd, ctx, S.PAUSING, lambda _: self._pause(cmd, defaults))
            case sb.SnapshotSandbox():
                await self._operate(
                    cmd, ctx, S.SNAPSHOTTING, lambda state: self._snapshot(cmd, state, ctx)
                )
            case sb.KillSandbox():
                await self._kill(cmd, ctx)
            case sb.ForkSandbox():
                await fork(self, cmd, ctx)
            case sb.SetSandboxTimeout():
                await execute(self.bus.sandboxes, cmd, ctx)
            case sb.UpdateSandboxNetwork():
                await update_network(self.bus, self.host, self.guest_config, cmd, ctx)
            case tp.ImportTemplateImage():
                await self._import(cmd, ctx)
            case tp.DeleteTemplate():
                await self.host.forget_template(cmd.template_id)
            case _:
                raise Invalid(f"{type(cmd).__name__} is not supported by this node")

    def _better_elsewhere(self, cmd: sb.CreateSandbox) -> str | None:
        """Why this node passes a create on (once), or None: its snapshot fork spread it
        elsewhere, other nodes hand a warm VM over, or hold the capture it would fetch."""
        if cmd.beside_parent:  # a running sandbox's fork child starts beside its parent
            return None
        if passes_on(cmd.prefer_on, self.node_id, 0):  # a snapshot fork's child
            return f"passed on to {', '.join(cmd.prefer_on)}, where its fork spread it"
        tpl = cmd.template_id
        if passes_on(cmd.warm_on, self.node_id, self.host.warm_stats().ready.get(tpl, 0)):
            return f"passed on to {', '.join(cmd.warm_on)}, which hold a warm VM of {tpl}"
        if passes_on(cmd.held_on, self.node_id, int(tpl in self.host.held_templates())):
            return f"passed on to {', '.join(cmd.held_on)}, which hold the capture of {tpl}"
        return None

    async def _operate(
        self, request: sb.AnySandboxCommand, ctx: MessageContext, expect: S, work: Work
    ) -> None:
        """The handler skeleton: the request decided into `expect` (else a redelivery of
        one that finished, or a no-op: nothing to do), the host's work, its completion."""
        state, _, _ = await execute(self.bus.sandboxes, request, ctx)
        if state is None or state.status is not expect:
            return
        done = await work(state)
        await execute(self.bus.sandboxes, done, ctx)

    async def _flushed(self, cmd: sb.PauseSandbox) -> dict[str, object] | None:
        """A filesystem-only pause flushes the guest before the pause is decided: a guest
        that does not answer is refused (503, as E2B's) and keeps running."""
        if cmd.keep_memory or not self.host.runs(cmd.sandbox_id):
            return None
        try:
            return await self.host.flush_guest(cmd.sandbox_id)
        except HostError as e:
            raise PermanentError(
                f"sandbox {cmd.sandbox_id} was not paused: {e}", code="unavailable"
            ) from e

    async def _pause(
        self, cmd: sb.PauseSandbox, defaults: dict[str, object] | None
    ) -> sb.CompletePause:
        error, snap_id, memory = None, None, cmd.keep_memory
        async with self.host.lock(cmd.sandbox_id):
            try:
                capture = await self.host.pause(
                    cmd.sandbox_id, keep_memory=cmd.keep_memory, guest_defaults=defaults
                )
                snap_id, memory = capture.snapshot_id, capture.memory
                self.journal.add(cmd.sandbox_id, capture.template_id, snap_id)
            except HostError as e:
                error = str(e)
        await self.route_publisher.dropped()
        return sb.CompletePause(
            sandbox_id=cmd.sandbox_id,
            snapshot_id=snap_id,
            error=error,
            memory=memory,
            command_id=completion_id(cmd, "paused"),
        )

    async def _snapshot(
        self, cmd: sb.SnapshotSandbox, state: sb.Sandbox, ctx: MessageContext
    ) -> sb.CompleteSnapshot:
        error, size = None, None
        async with self.host.lock(cmd.sandbox_id):
            try:
                capture = await self.host.snapshot(cmd.sandbox_id, cmd.snapshot_id)
                size = capture.size_bytes
                # registered with this capture first: its upload is recorded only against it
                register = tp.RegisterTemplate(
                    template_id=cmd.snapshot_id,
                    alias=None,
                    envd_version=state.envd_version,
                    cpu_count=state.cpu_count,
                    memory_mb=state.memory_mb,
                    disk_size_mb=state.disk_size_mb,
                    capture_id=capture.snapshot_id,
                    command_id=completion_id(cmd, "template"),
                )
                await execute(self.bus.templates, register, ctx)
            except HostError as e:
                error = str(e)
        return sb.CompleteSnapshot(
            sandbox_id=cmd.sandbox_id,
            snapshot_id=cmd.snapshot_id,
            size_bytes=size,
            error=error,
            node_id=self.node_id,
            command_id=completion_id(cmd, "snapshot"),
        )

    async def _kill(
        self, cmd: sb.KillSandbox, ctx: MessageContext, *, error: str | None = None
    ) -> None:
        async def work(_: sb.Sandbox) -> sb.CompleteKill:
            await self._remove(cmd.sandbox_id)
            return sb.CompleteKill(
                sandbox_id=cmd.sandbox_id, error=error, command_id=completion_id(cmd, "killed")
            )

        try:
            await self._operate(cmd, ctx, S.KILLING, work)
        except NotFound:
            if cmd.reason != "lost":
                raise
            # Killed in the log by someone else while this node was taken for gone (the
            # API's kill of a sandbox on a silent node, the timer's of a lost node's): they
            # tell the node's queue too, and a node that had only lost NATS for a while —
            # its VMs running on, as orphans — drops what it still holds of it.
            if await self._remove(cmd.sandbox_id):
                log.warning(
                    "sandbox %s was killed in the log but still here: removed it", cmd.sandbox_id
                )

    async def _remove(self, sandbox_id: str) -> bool:
        """The sandbox's VM or capture, journal entry and route gone; whether anything of
        it was here."""
        self.on_moot(sandbox_id)
        self.on_killed(sandbox_id)
        async with self.host.lock(sandbox_id):
            held = await self.host.kill(sandbox_id)
            self.journal.remove(sandbox_id)
        if held:
            self.node_disk.changed()  # its VM's files went: the room the API sees grows
        await self.route_publisher.dropped()
        return held

    async def _vm_died(self, sandbox_id: str, why: str, cause: str) -> None:
        self.metrics.died(cause)
        cid = sb.derived_command_id(sandbox_id, "vm-died", why)
        try:
            await self._kill_lost(sb.KillSandbox(sandbox_id=sandbox_id, command_id=cid), why)
        except Exception:  # the sandbox may be gone meanwhile; a restart reconciles the rest
            log.exception("recording the death of %s's VM failed", sandbox_id)

    async def guest_disk_full(self, sandbox_id: str, used: int, total: int) -> None:
        """A guest filled its root disk (the observer's new episode): an event on its log."""
        cid = sb.derived_command_id(sandbox_id, "disk-full", str(uuid.uuid4()))
        full = sb.RecordDiskFull(
            sandbox_id=sandbox_id, command_id=cid, used_bytes=used, total_bytes=total
        )
        await execute(self.bus.sandboxes, full, MessageContext(actor=f"node:{self.node_id}"))

    async def _kill_lost(self, cmd: sb.KillSandbox, why: str) -> None:
        """Not a client's kill: the log says the node asked, and why."""
        lost = cmd.model_copy(update={"reason": "lost"})
        await self._kill(lost, MessageContext(actor=f"node:{self.node_id}"), error=why)

    async def _paused_again(self, cmd: sb.PauseSandbox) -> None:
        """A resume rolled back after a restart (`reconcile`): paused on the capture held."""
        cid = cmd.command_id  # its outcome caused by the pause too: the pair of a request
        ctx = MessageContext(correlation_id=cid, causation_id=cid, actor=f"node:{self.node_id}")
        await self._operate(cmd, ctx, S.PAUSING, lambda _: self._pause(cmd, None))

    # ---- template imports and lookups: a module of their own ---------------------------
    async def _import(self, cmd: tp.ImportTemplateImage, ctx: MessageContext) -> None:
        await import_template(self.bus, self.host, self.node_id, cmd, ctx)
        self.metrics.image_builds.labels(self.node_id).inc()

    async def _locate_template(self, name: str) -> TemplateLocation | None:
        return await locate_template(self.bus, name)
