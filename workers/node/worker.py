"""The node worker: consumes this node's commands and placement creates, drives its `Host`
(the VM port: QEMU microVMs, or memory in the VM-less tier), and appends the outcomes.

Every sandbox handler has one shape (`_operate`): decide the request on the aggregate
(append its `*Requested` event), do the host's work, then decide the matching `Complete*`
command (append the outcome). Completion command ids derive from the request's, so a
redelivered request completes once. Creates and resumes add an early start (the VM starts
while the decision is appended: `workers/node/early.py`); a fork decides each child's
create on the child's own stream.

Routes (`routes.py`), the restart reconcile (`reconcile.py`) and the heartbeat
(`heartbeat.py`) are modules of their own; uploads are the snapshot worker's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from opentelemetry import trace

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
from bus.nodes import NodeBook
from bus.tasks import cancel_and_wait
from domain import DomainError, Invalid, NotFound
from domain import sandbox as sb
from domain import template as tp
from domain import volume as vo
from domain.sandbox import SandboxStatus as S
from workers.node.capacity import Size, ledger_of, no_room, size_of
from workers.node.completions import completion_id
from workers.node.early import EarlyStarts
from workers.node.forks import fork
from workers.node.heartbeat import beat_forever
from workers.node.journal import Journal
from workers.node.metrics import NodeMetrics
from workers.node.net.firewall import EgressPolicy
from workers.node.ports import (
    GuestConfig,
    GuestVolume,
    Host,
    HostError,
    TemplateLocation,
)
from workers.node.reconcile import reconcile
from workers.node.routes import RoutePublisher
from workers.node.settings import NodeSettings
from workers.node.template_work import import_template, locate_template
from workers.node.warmsize import passes_on

__all__ = ["NodeWorker", "completion_id", "egress_of"]

log = logging.getLogger(__name__)

#: A create another node took is watched this long (rounds times the poll) for its end or that
#: node's death (3 missed heartbeats: 15 s by default).
_TAKEN_POLL_S = 1.0
_TAKEN_WAIT_ROUNDS = 30

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


def _tracer() -> trace.Tracer:
    return trace.get_tracer("aenv.node")


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
        self.early = EarlyStarts(host)
        self.routes: RoutePublisher | None = None
        self._consumers: list[CommandConsumer] = []
        self._heartbeat: asyncio.Task[None] | None = None
        #: reconciled and pulling commands (the node's readiness)
        self.serving = False
        #: the fleet's heartbeats, opened when a create turns out to be another node's
        self._nodes: NodeBook | None = None
        host.set_template_locator(self._locate_template)
        host.on_died(self._vm_died)
        #: the node's series (`metrics.py`): stages timed here and by the host
        self.metrics = metrics or NodeMetrics(self.node_id)
        host.on_stage(self.metrics.stage)

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        restored = self.host.reload_templates()
        if restored:
            log.info("re-adopted %d snapshot templates", restored)
        self.routes = await RoutePublisher.open(self.bus, self.host, self.node_id, self.node_proxy)
        await reconcile(
            self.bus.sandboxes,
            self.host,
            self.journal,
            self.node_id,
            self.guest_config,
            self._kill_lost,
        )
        swept = await self.host.sweep_leftovers()
        if swept:
            log.info("removed %d directories left by a crash", swept)
        await self.routes.sweep()
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
        gates = [None, lambda: self.capacity.fits(self._typical)]
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
        beats = beat_forever(
            self.bus,
            self.host,
            self.node_id,
            self.settings.heartbeat_s,
            self.capacity.room,
            self.uploads_waiting,
            proxy=self.node_proxy,
        )
        self._heartbeat = asyncio.create_task(beats)
        # warm VMs live in the room the sandboxes leave: given up first when they need it
        self.host.start_warm_pool(lambda: self.capacity.room().free_mem_mib)
        self.serving = True

    async def stop(self) -> None:
        """Stop taking work and let in-flight commands finish (the consumers drain them)."""
        self.serving = False
        for c in self._consumers:
            await c.stop()
        # its KV put is a nats-py request, whose wait_for can swallow one cancel
        await cancel_and_wait(self._heartbeat)

    def guest_config(self, state: sb.Sandbox | sb.CreateSandbox) -> GuestConfig:
        """What envd is told: from a sandbox's state, or from a fork child's create."""
        return GuestConfig(
            env_vars=dict(state.env_vars),
            access_token=state.envd_access_token,
            egress=egress_of(state.network, self.settings.egress_enabled),
            volumes=tuple(GuestVolume(m.volume_id, m.name, m.path) for m in state.volume_mounts),
        )

    def ingress(self, sandbox_id: str) -> tuple[bool, str | None]:
        """Who may reach a sandbox's guest ports, for this node's proxy (not routed before
        `start`)."""
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
        match cmd:
            case sb.CreateSandbox():
                if d.attempt == 1 and self._warm_elsewhere(cmd):
                    raise RetryableError(
                        f"passed on to {', '.join(cmd.warm_on)}, which hold "
                        f"a warm VM of {cmd.template_id}",
                        delay_s=0,
                    )
                await self._create(cmd, ctx)
            case sb.ResumeSandbox():
                await self._resume(cmd, ctx)
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
                await self._fork(cmd, ctx)
            case sb.SetSandboxTimeout():
                await execute(self.bus.sandboxes, cmd, ctx)
            case tp.ImportTemplateImage():
                await self._import(cmd, ctx)
            case tp.DeleteTemplate():
                await self.host.forget_template(cmd.template_id)
            case _:
                raise Invalid(f"{type(cmd).__name__} is not supported by this node")

    def _warm_elsewhere(self, cmd: sb.CreateSandbox) -> bool:
        if cmd.forked_from is not None:  # a fork child starts beside its parent
            return False
        held = self.host.warm_stats().ready.get(cmd.template_id, 0)
        return passes_on(cmd.warm_on, self.node_id, held)

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
        await self.route_publisher.dropped()
        return held

    async def _vm_died(self, sandbox_id: str, why: str, cause: str) -> None:
        self.metrics.died(cause)
        cid = sb.derived_command_id(sandbox_id, "vm-died", why)
        try:
            await self._kill_lost(sb.KillSandbox(sandbox_id=sandbox_id, command_id=cid), why)
        except Exception:  # the sandbox may be gone meanwhile; a restart reconciles the rest
            log.exception("recording the death of %s's VM failed", sandbox_id)

    async def _kill_lost(self, cmd: sb.KillSandbox, why: str) -> None:
        """Not a client's kill: the log says the node asked, and why."""
        lost = cmd.model_copy(update={"reason": "lost"})
        await self._kill(lost, MessageContext(actor=f"node:{self.node_id}"), error=why)

    # ---- creates and resumes: the VM starts while the decision is appended -----------
    async def _create(self, cmd: sb.CreateSandbox, ctx: MessageContext) -> None:
        sid = cmd.sandbox_id
        if not self.host.runs(sid) and not self.capacity.take(sid, size_of(cmd)):
            raise no_room(self.node_id, size_of(cmd))  # another node may take it
        try:
            await self._create_held(cmd, ctx)
        finally:
            if not self.host.runs(sid):  # failed, refused, or not this node's to run
                self.capacity.release(sid)

    async def _create_held(self, cmd: sb.CreateSandbox, ctx: MessageContext) -> None:
        sid = cmd.sandbox_id
        # the request names the node that takes it: a create redelivered to another node
        # while this one still works on it (its heartbeats lost to a NATS outage) finds it
        # taken — the same event id, so JetStream keeps the first claim
        cmd = cmd.model_copy(update={"node_id": self.node_id})
        early = None
        # with volumes, nothing starts before the volumes are attached (after the claim)
        if not cmd.volume_mounts and self.early.creates(self.bus.sandboxes, cmd):
            early = await self.early.start(
                sid, lambda: self._start(sid, cmd.template_id, self.guest_config(cmd))
            )
        try:
            state, version, _ = await execute(self.bus.sandboxes, cmd, ctx)
        except BaseException:
            await self.early.undo(sid, early, self.journal)
            raise
        if state is None or state.status is not S.CREATING or state.node_id != self.node_id:
            await self.early.undo(sid, early, self.journal)
            # redelivery of a create that already finished: its route may not have made it
            if state is not None and state.status is S.RUNNING and state.node_id == self.node_id:
                await self.route_publisher.put(sid, state.traffic_access_token)
            elif state is not None and state.status is S.CREATING:
                await self._taken_elsewhere(cmd, state, ctx)
            return
        code = None
        if early is not None:
            error, _ = await early
        else:
            error, code = await self._attach(state, cmd, ctx)
            if error is None:
                error, _ = await self._start(sid, state.template_id, self.guest_config(state))
        token = state.traffic_access_token
        route = self.route_publisher.beside(sid, token) if error is None else None
        done = sb.CompleteCreate(
            sandbox_id=sid,
            node_id=self.node_id,
            error=error,
            code=code,
            warm=error is None and self.host.started_warm(sid),
            command_id=completion_id(cmd, "created"),
        )
        try:
            state, _, events = await execute(self.bus.sandboxes, done, ctx, known=(state, version))
        finally:
            if route is not None:
                await route
        if (
            error is None
            and not events
            and state is not None
            and state.status in (S.KILLING, S.KILLED, S.FAILED)
        ):  # killed while we were creating it: the VM must not outlive its sandbox
            late = sb.KillSandbox(sandbox_id=sid, command_id=completion_id(cmd, "kill-late"))
            await self._kill(late, ctx)

    async def _attach(
        self, state: sb.Sandbox, cmd: sb.CreateSandbox, ctx: MessageContext
    ) -> tuple[str | None, sb.FailureCode | None]:
        """The sandbox's volumes attached to it in the log (one holder at a time: a volume
        another sandbox holds refuses the create, 409) and their images ready here. What
        was attached before a failure stays attached to the failed sandbox; its end
        releases it (`volumes/releaser.py`)."""
        mounts = state.volume_mounts
        if not mounts:
            return None, None
        slots = await self.host.volume_slots(state.template_id)
        if slots < len(mounts):
            return (
                f"template {state.template_id!r} was captured without volume slots (before "
                "aenv had volumes): build or snapshot it again to mount volumes",
                "invalid",
            )
        for m in mounts:
            attach = vo.AttachVolume(
                volume_id=m.volume_id,
                holder=state.sandbox_id,
                node_id=self.node_id,
                command_id=completion_id(cmd, f"attach-{m.volume_id}"),
            )
            try:
                volume, _, _ = await execute(self.bus.volumes, attach, ctx)
            except DomainError as e:
                code: sb.FailureCode = "not_found" if isinstance(e, NotFound) else "conflict"
                return f"volume '{m.name}': {e.message}", code
            version = volume.version.key if volume is not None and volume.version else None
            try:
                async with self.host.volumes.lock(m.volume_id):
                    await self.host.volumes.prepare(m.volume_id, version, state.sandbox_id)
            except Exception as e:  # a pull that failed (S3 down), a full disk
                log.exception(
                    "volume %s for %s could not be prepared", m.volume_id, state.sandbox_id
                )
                return f"volume '{m.name}' could not be made ready on this node: {e}", None
        return None, None

    async def _move_volumes(self, state: sb.Sandbox) -> None:
        """A paused sandbox taken over here: its volumes' attachment moves with it (the
        node it left, should it come back, then releases nothing it no longer holds)."""
        for m in state.volume_mounts:
            move = vo.AttachVolume(
                volume_id=m.volume_id,
                holder=state.sandbox_id,
                node_id=self.node_id,
                command_id=sb.derived_command_id(
                    state.sandbox_id,
                    "take-over",
                    m.volume_id,
                    str(state.paused_snapshot_id),
                    self.node_id,
                ),
            )
            try:
                await execute(self.bus.volumes, move, MessageContext(actor=f"node:{self.node_id}"))
            except DomainError as e:
                raise HostError(f"volume '{m.name}' cannot move here: {e.message}") from e

    async def _taken_elsewhere(
        self, cmd: sb.CreateSandbox, state: sb.Sandbox, ctx: MessageContext
    ) -> None:
        """A create another node (or an API withdrawing it) took: its outcome is theirs.
        Waited for a while (the message kept alive), so that a create whose node died with
        it is answered: failed here once that node is gone, never left `creating`."""
        owner = state.node_id
        if owner is None:  # an API withdrew it, and records its failure itself
            return
        for _ in range(_TAKEN_WAIT_ROUNDS):
            if await self._gone(owner):
                done = sb.CompleteCreate(
                    sandbox_id=cmd.sandbox_id,
                    node_id=self.node_id,
                    error=f"node {owner}, which took it, is gone",
                    command_id=completion_id(cmd, "orphaned"),
                )
                await execute(self.bus.sandboxes, done, ctx)
                return
            await asyncio.sleep(_TAKEN_POLL_S)
            fresh, _ = await self.bus.sandboxes.load(cmd.sandbox_id)
            if fresh is None or fresh.status is not S.CREATING:
                return
        log.info("create of %s is still on node %s: leaving it there", cmd.sandbox_id, owner)

    async def _gone(self, node_id: str) -> bool:
        if self._nodes is None:
            self._nodes = await NodeBook.open(self.bus.js, self.bus.names.nodes_bucket)
        return await self._nodes.gone(node_id)

    async def _start(
        self, sandbox_id: str, template_id: str, guest: GuestConfig
    ) -> tuple[str | None, bool]:
        """Restore a new sandbox's VM: (error or None, whether this call started it)."""
        async with self.host.lock(sandbox_id):
            started = not self.host.runs(sandbox_id)
            self.journal.add(sandbox_id, template_id)
            try:
                with _tracer().start_as_current_span("restore sandbox VM") as span:
                    span.set_attribute("aenv.sandbox_id", sandbox_id)
                    await self.host.create(sandbox_id, template_id, guest)
            except HostError as e:
                self.journal.remove(sandbox_id)
                return str(e), False
            return None, started

    async def _resume(self, cmd: sb.ResumeSandbox, ctx: MessageContext) -> None:
        sid = cmd.sandbox_id
        known = self.bus.sandboxes.cached(sid)
        size = size_of(known[0]) if known is not None and known[0] is not None else self._typical
        # its own paused sandbox a node takes back whatever its room (no other node could);
        # one placed here because its node is gone only if it fits
        own = self.host.holds_paused(sid) or self.host.runs(sid)
        if not self.capacity.take(sid, size, force=own):
            raise no_room(self.node_id, size)
        try:
            await self._resume_held(cmd, ctx)
        finally:
            if not self.host.runs(sid):
                self.capacity.release(sid)

    async def _resume_held(self, cmd: sb.ResumeSandbox, ctx: MessageContext) -> None:
        sid = cmd.sandbox_id
        early = None
        if self.host.holds_paused(sid) and self.early.resumes(self.bus.sandboxes, cmd):
            # Not undone if the append fails: the capture is spent, and the command's
            # redelivery finds the sandbox running here.
            early = await self.early.start(sid, lambda: self._bring_back(sid, None))
        try:
            state, _, _ = await execute(self.bus.sandboxes, cmd, ctx)
        except DomainError:  # the log refuses the resume (killed meanwhile): so is its VM
            await self.early.undo(sid, early, self.journal)
            raise
        if state is None or state.status is not S.RESUMING:
            running_here = (
                state is not None and state.status is S.RUNNING and (state.node_id == self.node_id)
            )
            if state is None or not running_here:
                await self.early.undo(sid, early, self.journal)
            else:  # a redelivery: see _create
                await self.route_publisher.put(sid, state.traffic_access_token)
                self.host.resume_recorded(sid)
            return
        error, _ = await (early if early is not None else self._bring_back(sid, state))
        token = state.traffic_access_token
        route = self.route_publisher.beside(sid, token) if error is None else None
        done = sb.CompleteResume(
            sandbox_id=sid,
            node_id=self.node_id,
            error=error,
            command_id=completion_id(cmd, "resumed"),
        )
        try:
            await execute(self.bus.sandboxes, done, ctx)
        finally:
            if route is not None:
                await route
        self.host.resume_recorded(sid)

    async def _bring_back(
        self, sandbox_id: str, state: sb.Sandbox | None
    ) -> tuple[str | None, bool]:
        """Restore a paused sandbox here: (error or None, whether this call restored it)."""
        sid = sandbox_id
        self.on_moot(sid)  # the VM is about to write the RAM file an upload reads
        async with self.host.lock(sid):
            started = not self.host.runs(sid)
            try:
                if not self.host.holds_paused(sid) and not self.host.runs(sid):
                    # placed here because its own node is gone (the API checked): take it over
                    # from the repository
                    if (
                        state is None
                        or not state.resumable_anywhere
                        or (state.paused_snapshot_id is None)
                    ):
                        raise HostError(
                            f"sandbox {sid} is not paused on this node and its "
                            "capture is not in the repository"
                        )
                    await self._move_volumes(state)
                    await self.host.take_over_paused(
                        sid, state.template_id, state.paused_snapshot_id, self.guest_config(state)
                    )
                template = await self.host.resume(sid)
                self.journal.add(sid, template)
            except HostError as e:
                return str(e), False
            return None, started

    # ---- forks and template imports: modules of their own ------------------------------
    async def _fork(self, cmd: sb.ForkSandbox, ctx: MessageContext) -> None:
        await fork(self, cmd, ctx)

    async def _import(self, cmd: tp.ImportTemplateImage, ctx: MessageContext) -> None:
        await import_template(self.bus, self.host, self.node_id, cmd, ctx)

    async def _locate_template(self, name: str) -> TemplateLocation | None:
        return await locate_template(self.bus, name)
