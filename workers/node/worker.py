"""The node worker: consumes this node's commands and placement creates, drives the
sandbox host, and appends the outcome events.

Each handler follows the same shape: decide the request on the aggregate (append its
`*Requested` event), do the I/O, then decide the matching `Complete*` command (append the
outcome). Completion command ids derive from the request's, so a redelivered request
completes once.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any
from uuid import UUID

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
from bus.nodes import Heartbeat, NodeBook
from bus.routes import Route, RouteBook
from bus.tasks import cancel_and_wait
from domain import Command, DomainError, Invalid
from domain import sandbox as sb
from domain import template as tp
from domain.sandbox import SandboxStatus as S
from envd.version import ENVD_VERSION
from workers.node.host import GuestConfig, HostError, SandboxHost, TemplateLocation
from workers.node.image import build_from_oci
from workers.node.journal import Journal
from workers.node.net import EgressPolicy
from workers.node.runtime import Snapshot, allocated_bytes
from workers.node.settings import NodeSettings
from workers.node.templates import TemplateSpec

log = logging.getLogger(__name__)

#: Upload retries: 2 s, 6 s, 18 s, ... capped at 5 min, until the capture is durable or moot.
UPLOAD_RETRY_FIRST_S = 2.0
UPLOAD_RETRY_MAX_S = 300.0
#: A pause's upload starts this long after it answered: an agent that resumes within it (a
#: short wait on the model) costs the node no upload at all.
PAUSE_UPLOAD_DELAY_S = 2.0
#: Layer GC runs this long after the kill/resume/delete that asked for it.
GC_DELAY_S = 3.0


def egress_of(net: sb.NetworkPolicy, enabled: bool) -> EgressPolicy:
    return EgressPolicy(
        internet=net.allow_internet_access and enabled,
        allow=net.allow_out if enabled else (),
        deny=net.deny_out,
    )


def _tracer() -> trace.Tracer:
    return trace.get_tracer("aenv.node")


def completion_id(request: Command, what: str) -> UUID:
    """The id of the command that completes `request`: derived, so a redelivered request
    completes once."""
    return sb.derived_command_id(str(request.command_id), what)


class NodeWorker:
    def __init__(
        self, bus: Bus, host: SandboxHost, settings: NodeSettings, *,
        node_proxy: str | None = None,
    ) -> None:  # fmt: skip
        self.bus = bus
        #: host:port of this node's sandbox proxy, published in every route
        self.node_proxy = node_proxy
        self.host = host
        host.locate_template = self._locate_template
        self.settings = settings
        self.node_id = settings.node_id
        self.journal = Journal(settings.state_dir / "journal")
        self._consumers: list[CommandConsumer] = []
        self._heartbeat: asyncio.Task[None] | None = None
        self._gc: asyncio.Task[None] | None = None
        self._uploads: set[asyncio.Task[None]] = set()
        #: sandboxes whose VM starts while their create or resume is being appended
        self._early_starts: set[str] = set()
        self.routes: RouteBook | None = None
        self._route_drops: set[asyncio.Task[None]] = set()

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        restored = self.host.templates.reload()
        if restored:
            log.info("re-adopted %d snapshot templates", restored)
        for name, snap in self.host.templates.not_uploaded():
            self._upload_template_soon(name, snap)
        self.routes = await RouteBook.open(self.bus.js, self.bus.names.routes_bucket)
        self.host.on_gone.append(self._route_gone)
        await self.reconcile()
        await self._sweep_routes()
        names = self.bus.names
        specs = [
            ConsumerSpec(
                durable=names.node_consumer(self.node_id),
                filter_subject=names.node_commands(self.node_id),
            ),
            ConsumerSpec(
                durable=names.place_consumer,
                filter_subject=names.place_commands,
                max_ack_pending=max(1, self.settings.capacity),
            ),
        ]
        for spec in specs:
            c = CommandConsumer(
                self.bus.js, self.bus.settings, spec, self.handle, self.bus.rejection_sinks
            )
            await c.start()
            self._consumers.append(c)
        self._heartbeat = asyncio.create_task(self._beat())

    async def stop(self) -> None:
        """Stop taking work, let in-flight commands finish (the consumers drain them).
        Uploads in flight are abandoned: they resume from the journal at the next start."""
        for c in self._consumers:
            await c.stop()
        for task in list(self._uploads):
            task.cancel()
        # its KV put is a nats-py request, whose wait_for can swallow one cancel
        await cancel_and_wait(self._heartbeat)

    async def reconcile(self) -> None:
        """After a restart: running sandboxes lost their VMs (say so in the log); paused
        ones still have their captures on this disk (take them back, resumable)."""
        for entry in self.journal.entries():
            sid = entry.sandbox_id
            if sid in self.host.sandboxes or sid in self.host.paused:
                continue
            state, _ = await self.bus.sandboxes.load(sid)
            snap_dir = self.host.runtime.snapshot_dir(entry.paused_snapshot or "-")
            # Killed while this node was away (the API kills in the log then), or resumed on
            # another node from the repository: what is left here is a stale copy (its
            # layers go with the next GC).
            home = state.node_id if state is not None else None
            moved = home not in (None, self.node_id)
            if state is None or state.status in (S.KILLED, S.FAILED) or moved:
                if moved:
                    log.info("sandbox %s moved to node %s; dropping the local copy", sid, home)
                if entry.paused_snapshot:
                    shutil.rmtree(snap_dir, ignore_errors=True)
                self.journal.remove(sid)
                self._collect_soon()
                continue
            if state.status is S.PAUSED and (snap_dir / "manifest.json").exists():
                self.host.adopt_paused(sid, entry.template_id, snap_dir, self._guest(state))
                if state.durable_snapshot_id != entry.paused_snapshot:  # upload cut short
                    self._upload_soon(sid, self.host.paused[sid].snapshot)
                continue
            kill = sb.KillSandbox(
                sandbox_id=sid,
                command_id=sb.derived_command_id(sid, "reconcile", str(state.requested_at)),
            )
            await self._kill(kill, MessageContext(), error="node restarted; VM lost")

    async def _sweep_routes(self) -> None:
        """Routes this node published in an earlier life for VMs it no longer runs."""
        assert self.routes is not None
        for sid, route in (await self.routes.all()).items():
            if route.node_id == self.node_id and sid not in self.host.sandboxes:
                await self.routes.drop(sid)

    # ---- routes: where the proxy finds a guest ---------------------------------------
    async def _route(self, sandbox_id: str) -> None:
        """Where the proxy finds this sandbox's guest (the node's proxy and the guest address)."""
        address = self.host.upstream(sandbox_id)
        if self.routes is not None and address is not None:
            route = Route(node_id=self.node_id, address=address, node_proxy=self.node_proxy)
            await self.routes.put(sandbox_id, route)

    def _route_beside(self, sandbox_id: str) -> asyncio.Task[None]:
        """The route, written while the caller appends the event that announces the sandbox
        running (not before it: a round trip off every create and resume). The API's proxy
        waits for the route of a sandbox it knows running (`shared.proxy.routes`)."""
        return asyncio.create_task(self._route(sandbox_id), name=f"route:{sandbox_id}")

    def _route_gone(self, sandbox_id: str) -> None:
        """Host hook (kill, pause, close): the route goes; handlers await it before they
        announce the sandbox gone (`_routes_dropped`)."""
        if self.routes is None:
            return
        task = asyncio.create_task(self.routes.drop(sandbox_id), name=f"unroute:{sandbox_id}")
        self._route_drops.add(task)
        task.add_done_callback(self._route_drops.discard)

    async def _routes_dropped(self) -> None:
        if self._route_drops:
            await asyncio.gather(*self._route_drops, return_exceptions=True)

    def _guest(self, state: sb.Sandbox | sb.CreateSandbox) -> GuestConfig:
        """What envd is told: from a sandbox's state, or from a fork child's create."""
        return GuestConfig(
            env_vars=dict(state.env_vars),
            access_token=state.envd_access_token,
            egress=egress_of(state.network, self.settings.egress_enabled),
        )

    # ---- dispatch --------------------------------------------------------------------
    async def handle(self, d: Delivery) -> None:
        cmd = d.command
        match cmd:
            case sb.CreateSandbox():
                await self._create(cmd, d.context)
            case sb.KillSandbox():
                await self._kill(cmd, d.context)
            case sb.SetSandboxTimeout():
                await execute(self.bus.sandboxes, cmd, d.context)
            case sb.PauseSandbox():
                await self._pause(cmd, d.context)
            case sb.ResumeSandbox():
                await self._resume(cmd, d.context)
            case sb.ForkSandbox():
                await self._fork(cmd, d.context)
            case sb.SnapshotSandbox():
                await self._snapshot(cmd, d.context)
            case tp.ImportTemplateImage():
                await self._import(cmd, d.context)
            case tp.DeleteTemplate():
                snap = self.host.templates.forget(cmd.template_id)
                if snap is not None:
                    self.host.runtime.delete_snapshot(snap)
                    self._collect_soon()
            case _:
                raise Invalid(f"{type(cmd).__name__} is not supported by this node yet")

    async def _import(self, cmd: tp.ImportTemplateImage, ctx: MessageContext) -> None:
        """An OCI image becomes a template on this node: converted (cached by content),
        booted once, captured and adopted (so a restart keeps it)."""
        name = cmd.template_id
        try:
            image = await asyncio.to_thread(
                build_from_oci, Path(cmd.image_path), f"tpl-{name}",
                progress=lambda m: log.info("import %s: %s", name, m),
            )  # fmt: skip
            self.host.templates.register(
                TemplateSpec(name, vcpus=cmd.cpu_count, mem_mib=cmd.memory_mb), lambda: image
            )
            snap = await self.host.templates.get(name)
            self.host.templates.adopt(name, snap, None)
        except Exception as e:
            # the consumer answers it on the template's subject, where the requester waits
            log.exception("import of %s as %s failed", cmd.image_path, name)
            raise PermanentError(f"image {cmd.image_path}: {e}") from e
        register = tp.RegisterTemplate(
            template_id=name, alias=cmd.alias, envd_version=ENVD_VERSION,
            cpu_count=cmd.cpu_count, memory_mb=cmd.memory_mb,
            disk_size_mb=image.rootfs.stat().st_size >> 20,
            command_id=completion_id(cmd, "registered"),
        )  # fmt: skip
        await execute(self.bus.templates, register, ctx)
        # the answer the requester waits for: after the registration
        done = tp.CompleteTemplateImport(template_id=name, image_digest=image.digest,
                                         node_id=self.node_id,
                                         command_id=completion_id(cmd, "imported"))  # fmt: skip
        await execute(self.bus.templates, done, ctx)

    async def _create(self, cmd: sb.CreateSandbox, ctx: MessageContext) -> None:
        sid = cmd.sandbox_id
        if self.host.free <= 0 and sid not in self.host.sandboxes:
            raise RetryableError("node is full", delay_s=1.0)  # another node may take it
        # The VM starts while the decision is appended (see `_early`): the round trip to
        # the log is off the create's path. The decision is still made first in the log's
        # order; a create the log refuses gets its VM removed.
        early = None
        if self._creates(cmd):
            early = await self._early(
                sid, lambda: self._start(sid, cmd.template_id, self._guest(cmd))
            )
        try:
            state, version, _ = await execute(self.bus.sandboxes, cmd, ctx)
        except BaseException:
            if early is not None:
                await self._undo_start(sid, early)
            raise
        if state is None or state.status is not S.CREATING:
            if early is not None:
                await self._undo_start(sid, early)
            # redelivery of a create that already finished: its route may not have made it
            if state is not None and state.status is S.RUNNING:
                await self._route(sid)
            return
        if early is None:
            error, _ = await self._start(sid, state.template_id, self._guest(state))
        else:
            error, _ = await early
        route = self._route_beside(sid) if error is None else None
        done = sb.CompleteCreate(
            sandbox_id=sid, node_id=self.node_id, error=error,
            command_id=completion_id(cmd, "created"),
        )  # fmt: skip
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
        ):
            # killed while we were creating it: the VM must not outlive its sandbox
            await self._kill(
                sb.KillSandbox(sandbox_id=sid, command_id=completion_id(cmd, "kill-late")), ctx
            )

    def _creates(self, cmd: sb.CreateSandbox) -> bool:
        """Whether the create will most likely be decided as new: the node has never seen
        the sandbox (one it knows is a duplicate) and the command itself is valid."""
        if self.bus.sandboxes.cached(cmd.sandbox_id) is not None:
            return False
        try:
            return bool(sb.decide(None, cmd))
        except DomainError:
            return False

    async def _early(
        self, sandbox_id: str, start: Callable[[], Coroutine[Any, Any, tuple[str | None, bool]]]
    ) -> asyncio.Task[tuple[str | None, bool]] | None:
        """Start a create's or resume's VM before its decision is in the log — but only for
        a sandbox this node is doing nothing with (a redelivery of a command under way or
        done here takes the plain path), so undoing it never touches another's VM.

        The VM's start runs first, up to its first wait; the decision's CPU work (decide,
        encode, publish) then overlaps the restore instead of delaying its beginning."""
        sid = sandbox_id
        if sid in self.host.sandboxes or sid in self._early_starts or self.host.lock(sid).locked():
            return None
        self._early_starts.add(sid)
        task = asyncio.create_task(start(), name=f"early:{sid}")
        task.add_done_callback(lambda _: self._early_starts.discard(sid))
        await asyncio.sleep(0)
        return task

    async def _start(
        self, sandbox_id: str, template_id: str, guest: GuestConfig
    ) -> tuple[str | None, bool]:
        """Restore a new sandbox's VM: (error or None, whether this call started it)."""
        async with self.host.lock(sandbox_id):
            started = sandbox_id not in self.host.sandboxes
            self.journal.add(sandbox_id, template_id)
            try:
                with _tracer().start_as_current_span("restore sandbox VM") as span:
                    span.set_attribute("aenv.sandbox_id", sandbox_id)
                    await self.host.create(sandbox_id, template_id, guest)
            except HostError as e:
                self.journal.remove(sandbox_id)
                return str(e), False
            return None, started

    async def _undo_start(
        self, sandbox_id: str, early: asyncio.Task[tuple[str | None, bool]]
    ) -> None:
        """The log refused the create or resume (or could not be written, for a create):
        the VM started early goes."""
        error, started = await early
        if error is None and started:
            async with self.host.lock(sandbox_id):
                await self.host.kill(sandbox_id)
                self.journal.remove(sandbox_id)

    async def _pause(self, cmd: sb.PauseSandbox, ctx: MessageContext) -> None:
        state, _, _ = await execute(self.bus.sandboxes, cmd, ctx)
        if state is None or state.status is not S.PAUSING:
            return
        error, snap_id = None, None
        async with self.host.lock(cmd.sandbox_id):
            try:
                paused = await self.host.pause(cmd.sandbox_id)
                snap_id = paused.snapshot.snapshot_id
                self.journal.add(cmd.sandbox_id, paused.template_id, snap_id)
                self._upload_soon(cmd.sandbox_id, paused.snapshot)
            except HostError as e:
                error = str(e)
        await self._routes_dropped()
        done = sb.CompletePause(sandbox_id=cmd.sandbox_id, snapshot_id=snap_id, error=error,
                                command_id=completion_id(cmd, "paused"))  # fmt: skip
        await execute(self.bus.sandboxes, done, ctx)

    async def _resume(self, cmd: sb.ResumeSandbox, ctx: MessageContext) -> None:
        sid = cmd.sandbox_id
        if sid not in self.host.paused and self.host.free <= 0:
            raise RetryableError("node is full", delay_s=1.0)  # placed: another node may take it
        early = None
        if sid in self.host.paused and self._resumes(cmd):
            # As for a create, the VM comes back while the decision is appended. Not undone
            # if the append fails: the capture is spent, and the command's redelivery finds
            # the sandbox running here.
            early = await self._early(sid, lambda: self._bring_back(sid, None))
        try:
            state, _, _ = await execute(self.bus.sandboxes, cmd, ctx)
        except DomainError:  # the log refuses the resume (killed meanwhile): so is its VM
            if early is not None:
                await self._undo_start(sid, early)
            raise
        if state is None or state.status is not S.RESUMING:
            running_here = state is not None and state.status is S.RUNNING and (
                state.node_id == self.node_id
            )
            if early is not None and not running_here:
                await self._undo_start(sid, early)
            if running_here:  # a redelivery: see _create
                await self._route(sid)
            return
        error, _ = await (early if early is not None else self._bring_back(sid, state))
        route = self._route_beside(sid) if error is None else None
        done = sb.CompleteResume(sandbox_id=sid, node_id=self.node_id, error=error,
                                 command_id=completion_id(cmd, "resumed"))  # fmt: skip
        try:
            await execute(self.bus.sandboxes, done, ctx)
        finally:
            if route is not None:
                await route

    def _resumes(self, cmd: sb.ResumeSandbox) -> bool:
        """Whether the log, as this node last saw it, would resume the sandbox (the guess an
        early start rests on; a wrong one costs a VM that is killed or kept, never state)."""
        known = self.bus.sandboxes.cached(cmd.sandbox_id)
        if known is None or known[0] is None or known[0].status is not S.PAUSED:
            return False
        try:
            return any(isinstance(e, sb.SandboxResumeRequested) for e in sb.decide(known[0], cmd))
        except DomainError:
            return False

    async def _bring_back(
        self, sandbox_id: str, state: sb.Sandbox | None
    ) -> tuple[str | None, bool]:
        """Restore a paused sandbox here: (error or None, whether this call restored it)."""
        sid = sandbox_id
        self._cancel_upload(f"upload:{sid}")  # the VM is about to write the RAM file it reads
        async with self.host.lock(sid):
            started = sid not in self.host.sandboxes
            try:
                if sid not in self.host.paused and sid not in self.host.sandboxes:
                    # placed here because its own node is gone (the API checked): take it over
                    # from the repository
                    if state is None or not state.resumable_anywhere or (
                        state.paused_snapshot_id is None
                    ):
                        raise HostError(f"sandbox {sid} is not paused on this node and its "
                                        "capture is not in the repository")  # fmt: skip
                    await self.host.pull_paused(sid, state.template_id, state.paused_snapshot_id,
                                                self._guest(state))  # fmt: skip
                live = await self.host.resume(sid)
                self.journal.add(sid, live.template_id)
                self._collect_soon()
            except HostError as e:
                return str(e), False
            return None, started

    async def _fork(self, cmd: sb.ForkSandbox, ctx: MessageContext) -> None:
        """One capture of the parent, `count` copy-on-write children on this node. Each
        child is a sandbox of its own (its create decided on its own stream, with a fresh
        access token and `forked_from` lineage); the parent's stream records the outcome."""
        state, _, _ = await execute(self.bus.sandboxes, cmd, ctx)
        if state is None or state.status is not S.FORKING:
            return
        creates: dict[str, sb.CreateSandbox] = {}
        for cid in state.pending_children:
            create = sb.fork_child_command(state, cid, cmd)
            if state.envd_access_token is not None:
                create = create.model_copy(update={"envd_access_token": secrets.token_urlsafe(24)})
            child, _, _ = await execute(self.bus.sandboxes, create.model_copy(
                update={"node_id": self.node_id}), ctx)  # fmt: skip
            if child is not None and child.status is S.CREATING:
                creates[cid] = create
        errors: dict[str, str | None] = {}
        async with self.host.lock(cmd.sandbox_id):
            try:
                guests = {cid: self._guest(c) for cid, c in creates.items()}
                errors = await self.host.fork(cmd.sandbox_id, guests) if guests else {}
            except HostError as e:
                errors = {cid: str(e) for cid in creates}
        await asyncio.gather(*(self._route(cid) for cid in creates if errors.get(cid) is None))
        for cid, create in creates.items():
            if errors.get(cid) is None:
                self.journal.add(cid, state.template_id)
            done = sb.CompleteCreate(sandbox_id=cid, node_id=self.node_id, error=errors.get(cid),
                                     command_id=completion_id(create, "created"))  # fmt: skip
            await execute(self.bus.sandboxes, done, ctx)
        results = tuple(
            sb.ForkChildResult(sandbox_id=cid, error=errors.get(cid, "child already existed"))
            if cid in creates else sb.ForkChildResult(sandbox_id=cid, error=None)
            for cid in state.pending_children
        )  # fmt: skip
        finished = sb.CompleteFork(sandbox_id=cmd.sandbox_id, children=results,
                                   command_id=completion_id(cmd, "forked"))  # fmt: skip
        await execute(self.bus.sandboxes, finished, ctx)

    async def _snapshot(self, cmd: sb.SnapshotSandbox, ctx: MessageContext) -> None:
        state, _, _ = await execute(self.bus.sandboxes, cmd, ctx)
        if state is None or state.status is not S.SNAPSHOTTING:
            return
        error, size = None, None
        async with self.host.lock(cmd.sandbox_id):
            try:
                snap = await self.host.snapshot(cmd.sandbox_id, cmd.snapshot_id)
                size = sum(allocated_bytes(p) for p in (snap.mem, snap.state, snap.disk_top))
                # registered with this capture first: its upload is recorded only against it
                register = tp.RegisterTemplate(
                    template_id=cmd.snapshot_id, alias=None,
                    envd_version=state.envd_version, cpu_count=state.cpu_count,
                    memory_mb=state.memory_mb, disk_size_mb=state.disk_size_mb,
                    capture_id=snap.snapshot_id, command_id=completion_id(cmd, "template"),
                )  # fmt: skip
                await execute(self.bus.templates, register, ctx)
                self._upload_template_soon(cmd.snapshot_id, snap)
            except HostError as e:
                error = str(e)
        done = sb.CompleteSnapshot(sandbox_id=cmd.sandbox_id, snapshot_id=cmd.snapshot_id,
                                   size_bytes=size, error=error, node_id=self.node_id,
                                   command_id=completion_id(cmd, "snapshot"))  # fmt: skip
        await execute(self.bus.sandboxes, done, ctx)

    async def _kill(
        self, cmd: sb.KillSandbox, ctx: MessageContext, *, error: str | None = None
    ) -> None:
        await execute(self.bus.sandboxes, cmd, ctx)
        self._cancel_upload(f"upload:{cmd.sandbox_id}")
        async with self.host.lock(cmd.sandbox_id):
            await self.host.kill(cmd.sandbox_id)
            self.journal.remove(cmd.sandbox_id)
        await self._routes_dropped()
        self._collect_soon()
        done = sb.CompleteKill(
            sandbox_id=cmd.sandbox_id, error=error, command_id=completion_id(cmd, "killed")
        )
        await execute(self.bus.sandboxes, done, ctx)

    def _upload_soon(self, sandbox_id: str, snap: Snapshot) -> None:
        """Upload after the pause has answered (design §7); durable once recorded."""
        if self.host.repository is None:
            return

        def moot() -> bool:  # resumed or killed meanwhile: this capture no longer matters
            paused = self.host.paused.get(sandbox_id)
            return paused is None or paused.snapshot.snapshot_id != snap.snapshot_id

        async def attempt() -> None:
            size = await self.host.upload(sandbox_id, snap)
            if size is not None:
                done = sb.RecordUpload(sandbox_id=sandbox_id, snapshot_id=snap.snapshot_id,
                                       size_bytes=size)  # fmt: skip
                await execute(self.bus.sandboxes, done, MessageContext())

        self._retry_soon(f"upload:{sandbox_id}", snap.snapshot_id, attempt, moot,
                         first_delay=PAUSE_UPLOAD_DELAY_S)  # fmt: skip

    async def _locate_template(self, name: str) -> TemplateLocation | None:
        """Where the log says a snapshot template taken elsewhere is durable, with the
        envd token its captured guest holds (its source sandbox's)."""
        tpl, _ = await self.bus.templates.load(name)
        if tpl is None or tpl.deleted or tpl.capture_key is None or tpl.capture_of is None:
            return None
        source, _ = await self.bus.sandboxes.load(tpl.capture_of)
        token = source.envd_access_token if source is not None else None
        return tpl.capture_key, token, tpl.capture_of

    def _upload_template_soon(self, name: str, snap: Snapshot) -> None:
        """A persistent snapshot goes to the repository too: the template outlives this
        disk (pulled back on first use if the local capture is lost) and this node (the log
        records where it is, `TemplateUploaded`: another node takes it over from there)."""
        if self.host.repository is None:
            return

        def moot() -> bool:  # deleted, or replaced by a newer capture under the same name
            return all(c.dir != snap.dir for c in self.host.templates.captures())

        async def attempt() -> None:
            if not await self.host.upload_template(name, snap):
                return
            source = self.host.templates.source_of(name)
            if source is not None:
                uploaded = tp.RecordTemplateUpload(template_id=name, key=snap.snapshot_id,
                                                   source_sandbox_id=source)  # fmt: skip
                await execute(self.bus.templates, uploaded)

        self._retry_soon(f"upload-template:{name}", snap.snapshot_id, attempt, moot)

    def _retry_soon(
        self, label: str, what: str, attempt: Callable[[], Awaitable[None]],
        moot: Callable[[], bool], *, first_delay: float = 0.0,
    ) -> None:  # fmt: skip
        """Run `attempt` in the background, retried with capped backoff (S3 down: the pause
        or snapshot stands, it is just not durable yet) until it succeeds or is `moot`.
        Blobs already up are skipped on the next try (content-addressed)."""

        async def run() -> None:
            delay = first_delay
            while True:
                await asyncio.sleep(delay)
                if moot():
                    return
                try:
                    await attempt()
                    return
                except Exception as e:
                    delay = min(max(UPLOAD_RETRY_FIRST_S, delay * 3), UPLOAD_RETRY_MAX_S)
                    log.warning("upload of %s failed (retry in %.0fs): %s", what, delay, e)

        self._cancel_upload(label)  # a newer capture of the same thing supersedes it
        task = asyncio.create_task(run(), name=label)
        self._uploads.add(task)
        task.add_done_callback(self._uploads.discard)

    def _cancel_upload(self, label: str) -> None:
        """Stop an upload that became moot mid-way (its sandbox resumed or was killed): it
        would only spend CPU a restore needs, reading a RAM file the VM now writes to."""
        for task in self._uploads:
            if task.get_name() == label and not task.done():
                task.cancel()

    def _collect_soon(self) -> None:
        """Layer GC off the command path, a few seconds later (it reads every chain with
        qemu-img: CPU the next create or resume should not share); many kills and resumes
        in a row coalesce into one run."""
        if self._gc is None or self._gc.done():
            self._gc = asyncio.create_task(self._collect())

    async def _collect(self) -> None:
        await asyncio.sleep(GC_DELAY_S)
        await self.host.runtime.foreground.settled()  # housekeeping: after the restores
        try:
            freed = await self.host.collect_garbage()
            if freed:
                log.info("freed %d unused disk layers", freed)
        except Exception as e:  # GC is best effort; the next kill retries
            log.warning("layer GC failed: %s", e)

    # ---- capacity --------------------------------------------------------------------
    async def _beat(self) -> None:
        book = await NodeBook.open(self.bus.js, self.bus.names.nodes_bucket)
        while True:
            beat = Heartbeat(
                node_id=self.node_id,
                at=time.time(),
                every_s=self.settings.heartbeat_s,
                capacity=self.host.capacity,
                free=self.host.free,
                running=len(self.host.sandboxes),
                accelerator=self.host.runtime.accel.accel,
                accelerator_reason=self.host.runtime.accel.reason,
                qemu=self.host.runtime.qemu_version,
            )
            try:
                await book.beat(beat)
            except Exception as e:  # a missed heartbeat is retried on the next beat
                log.warning("node heartbeat failed: %s", e)
            await asyncio.sleep(self.settings.heartbeat_s)
