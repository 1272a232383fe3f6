"""The node's creates and resumes: the VM starts while the decision is appended.

Both have one shape (`Openings._open`), run on a `Verb` (`verbs.py`) that holds all that
differs: room taken for the VM, maybe an early start (`early.py`), the request decided on
the aggregate (an early VM undone if the log refuses it; a redelivery re-puts its route, a
create another node took is watched), the host's work, the completion decided with the
route published beside it, and the room released if the VM does not run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from opentelemetry import trace

from bus import MessageContext
from bus.decisions import execute
from bus.diskroom import disk_need, fits_disk
from bus.failpoints import failpoint
from domain import DomainError
from domain import sandbox as sb
from domain.sandbox import SandboxStatus as S
from workers.node.capacity import Size, cannot_hold, no_disk_room, no_room, size_of
from workers.node.completions import completion_id
from workers.node.early import EarlyStarts, Started, Starter
from workers.node.ports import GuestConfig, HostError
from workers.node.site import NodeSite
from workers.node.taken import TakenCreates
from workers.node.verbs import (
    C,
    Next,
    Outcome,
    Verb,
    after_request,
    failed_meanwhile,
    killed_meanwhile,
)
from workers.node.volume_claims import attach_volumes, move_volumes

__all__ = ["Openings"]

log = logging.getLogger(__name__)

#: How a killed-meanwhile sandbox's VM is killed: the worker's kill handler.
Kill = Callable[[sb.KillSandbox, MessageContext], Awaitable[None]]

#: How long a create waits, before it claims its sandbox, for its template's fetch to be
#: refused (a full disk budget refuses at its reservation, bytes that are nowhere at the
#: manifest: both within this): refused, it goes to another node. A fetch that takes
#: longer goes on under the claim (the create's restore waits for it), so that the API,
#: which withdraws a create nobody claims within `AENV_PLACEMENT_TIMEOUT_S` (10 s), still
#: sees it taken after a few nodes have refused it.
EARLY_REFUSAL_S = 2.0


def _tracer() -> trace.Tracer:
    return trace.get_tracer("aenv.node")


class Openings:
    def __init__(
        self,
        site: NodeSite,
        typical: Size,
        *,
        on_moot: Callable[[str], None],
        kill: Kill,
        disk_room: Callable[[], int | None] = lambda: None,
        disk_headroom: int = 0,
        disk_changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.site = site
        #: a create or resume wrote (or failed and removed) a VM's files: walk the disk soon
        self._disk_changed = disk_changed
        #: bytes this node could hold for a new sandbox (None: unknown, no check), and what
        #: a create keeps free beyond what it fetches (`bus.diskroom`)
        self._disk_room = disk_room
        self._disk_headroom = disk_headroom
        self.early = EarlyStarts(site.host)
        #: what a resume whose sandbox this node never saw is taken to need
        self._typical = typical
        #: told a sandbox's paused capture is moot (resumed): its upload stops
        self._on_moot = on_moot
        self._kill = kill
        self.taken = TakenCreates(site.bus, site.node_id)
        #: creates whose restore failed `unavailable` (a fetch under the claim the disk
        #: refused, bytes that are nowhere): completed with that code, answered 503
        self._unavailable: set[str] = set()
        self.creating: Verb[sb.CreateSandbox] = Verb(
            expect=S.CREATING,
            take=self._room_to_create,
            ready=self._template_to_create,
            early=self._early_create,
            work=self._create_work,
            complete=self._created,
            undo_on=BaseException,
            keeps_early=False,
            known=True,
            kill_late=True,
            recorded=lambda _: None,
            watch_taken=self.taken.watch,
        )
        self.resuming: Verb[sb.ResumeSandbox] = Verb(
            expect=S.RESUMING,
            take=self._room_to_resume,
            ready=_nothing,
            early=self._early_resume,
            work=self._resume_work,
            complete=self._resumed,
            # Not undone if the append fails: the capture is spent, and the command's
            # redelivery finds the sandbox running here. A resume the log refuses (killed
            # meanwhile) is: so is its VM.
            undo_on=DomainError,
            keeps_early=True,
            known=False,
            kill_late=False,
            recorded=self._resume_recorded,
            failed_late=self._resume_undone,
        )

    async def create(self, cmd: sb.CreateSandbox, ctx: MessageContext) -> None:
        # the request names the node that takes it: a create redelivered to another node
        # while this one still works on it (its heartbeats lost to a NATS outage) finds it
        # taken — the same event id, so JetStream keeps the first claim
        await self._open(self.creating, cmd.model_copy(update={"node_id": self.site.node_id}), ctx)

    async def resume(self, cmd: sb.ResumeSandbox, ctx: MessageContext) -> None:
        # named in the request too: while it resumes, the sandbox is this node's — the
        # fleet's timer ends it only if this node is gone, never for the loss of the node
        # it was paused on (taken over from the repository here)
        await self._open(self.resuming, cmd.model_copy(update={"node_id": self.site.node_id}), ctx)

    # ---- the skeleton --------------------------------------------------------------------
    async def _open(self, verb: Verb[C], cmd: C, ctx: MessageContext) -> None:
        sid = cmd.sandbox_id
        verb.take(cmd)
        try:
            await verb.ready(cmd)
            await self._held(verb, cmd, ctx)
        finally:
            self._unavailable.discard(sid)
            if not self.site.host.runs(sid):  # failed, refused, or not this node's to run
                self.site.capacity.release(sid)
            self._disk_changed()

    async def _held(self, verb: Verb[C], cmd: C, ctx: MessageContext) -> None:
        site, sid = self.site, cmd.sandbox_id
        held = site.host.held_capture(sid)  # what an early resume would restore
        starter = verb.early(cmd)
        early = await self.early.start(sid, starter) if starter is not None else None
        try:
            state, version, _ = await execute(site.bus.sandboxes, cmd, ctx)
        except verb.undo_on:
            await self.early.undo(sid, early, site.journal)
            raise
        step = after_request(
            state,
            verb.expect,
            site.node_id,
            claims=verb.watch_taken is not None,
            request=cmd.command_id,
        )
        if step is not Next.WORK or state is None:
            if step is not Next.REPUT or not verb.keeps_early:
                await self.early.undo(sid, early, site.journal)
            if step is Next.REPUT and state is not None:
                await site.route_publisher.put(sid, state.traffic_access_token)
                verb.recorded(sid)
            elif step is Next.TAKEN and state is not None and verb.watch_taken is not None:
                await verb.watch_taken(cmd, state, ctx)
            return
        code = None
        if early is not None and stale_copy(state, held):  # guessed from a stale fold
            await self.early.undo(sid, early, site.journal)
            early = None
        if early is not None:
            error, _ = await early
        else:
            error, code = await verb.work(cmd, state, ctx)
        token = state.traffic_access_token
        route = site.route_publisher.beside(sid, token) if error is None else None
        done = verb.complete(cmd, error, code)
        known = (state, version) if verb.known else None
        try:
            state, _, events = await execute(site.bus.sandboxes, done, ctx, known=known)
        finally:
            if route is not None:
                await route
        if verb.failed_late is not None and failed_meanwhile(error, events, state):
            assert state is not None  # (failed_meanwhile says so)
            await verb.failed_late(state)  # not recorded: the capture is the log's again
            return
        verb.recorded(sid)
        if verb.kill_late and killed_meanwhile(error, events, state):
            late = sb.KillSandbox(sandbox_id=sid, command_id=completion_id(cmd, "kill-late"))
            await self._kill(late, ctx)

    # ---- a create ----------------------------------------------------------------------
    def _room_to_create(self, cmd: sb.CreateSandbox) -> None:
        sid, size = cmd.sandbox_id, size_of(cmd)
        if self.site.host.runs(sid):
            return
        self._disk_to_create(cmd)  # before the ledger: a refusal leaves nothing taken
        if not self.site.capacity.take(sid, size):
            raise no_room(self.site.node_id, size)  # another node may take it

    def _disk_to_create(self, cmd: sb.CreateSandbox) -> None:
        """A create whose template (and headroom) this node's disk cannot hold is refused
        like one its memory cannot: a short nak, and another node takes it."""
        held = cmd.template_id in self.site.host.held_templates()
        need = disk_need(cmd.template_bytes, self._disk_headroom, held=held)
        room = self._disk_room()
        if not fits_disk(room, need):
            raise no_disk_room(self.site.node_id, cmd.template_id, need, room or 0)

    async def _template_to_create(self, cmd: sb.CreateSandbox) -> None:
        """The template fetched before the create claims its sandbox: a fetch this node's
        disk refuses (`NoRoom`), or of bytes that are nowhere, is `unavailable` — a nak,
        and another node takes the create; on the last delivery the API answers 503 with
        the refusal. Any other failure is the create's, reported after its claim."""
        host, tpl = self.site.host, cmd.template_id
        if host.runs(cmd.sandbox_id):
            return
        fetch = asyncio.ensure_future(host.hold_template(tpl))
        try:
            await asyncio.wait_for(asyncio.shield(fetch), EARLY_REFUSAL_S)
        except TimeoutError:
            fetch.add_done_callback(_settled)  # the create's own restore waits on it
        except HostError as e:
            if e.code == "unavailable":
                raise cannot_hold(self.site.node_id, tpl, str(e)) from e

    def _early_create(self, cmd: sb.CreateSandbox) -> Starter | None:
        # with volumes, nothing starts before the volumes are attached (after the claim)
        if cmd.volume_mounts or not self.early.creates(self.site.bus.sandboxes, cmd):
            return None
        guest = self.site.guest_config(cmd)
        return lambda: self._start(cmd.sandbox_id, cmd.template_id, guest)

    async def _create_work(
        self, cmd: sb.CreateSandbox, state: sb.Sandbox, ctx: MessageContext
    ) -> Outcome:
        site = self.site
        error, code = await attach_volumes(site.bus, site.host, site.node_id, state, cmd, ctx)
        if error is None:
            # the spec as the log has it, with the create's copy-on-write hint
            guest = replace(site.guest_config(state), copy_on_write=cmd.copy_on_write)
            error, _ = await self._start(state.sandbox_id, state.template_id, guest)
        return error, code

    def _created(
        self, cmd: sb.CreateSandbox, error: str | None, code: sb.FailureCode | None
    ) -> sb.CompleteCreate:
        if error is not None and code is None and cmd.sandbox_id in self._unavailable:
            code = "unavailable"
        return sb.CompleteCreate(
            sandbox_id=cmd.sandbox_id,
            node_id=self.site.node_id,
            error=error,
            code=code,
            warm=error is None and self.site.host.started_warm(cmd.sandbox_id),
            command_id=completion_id(cmd, "created"),
        )

    async def _start(self, sandbox_id: str, template_id: str, guest: GuestConfig) -> Started:
        """Restore a new sandbox's VM: (error or None, whether this call started it)."""
        host, journal = self.site.host, self.site.journal
        async with host.lock(sandbox_id):
            started = not host.runs(sandbox_id)
            journal.add(sandbox_id, template_id)
            try:
                with _tracer().start_as_current_span("restore sandbox VM") as span:
                    span.set_attribute("aenv.sandbox_id", sandbox_id)
                    await host.create(sandbox_id, template_id, guest)
            except HostError as e:
                journal.remove(sandbox_id)
                if e.code == "unavailable":
                    self._unavailable.add(sandbox_id)
                return str(e), False
            return None, started

    # ---- a resume ----------------------------------------------------------------------
    def _room_to_resume(self, cmd: sb.ResumeSandbox) -> None:
        sid, host = cmd.sandbox_id, self.site.host
        known = self.site.bus.sandboxes.cached(sid)
        size = size_of(known[0]) if known is not None and known[0] is not None else self._typical
        # its own paused sandbox a node takes back whatever its room (no other node could);
        # one placed here because its node is gone only if it fits
        own = host.holds_paused(sid) or host.runs(sid)
        if not self.site.capacity.take(sid, size, force=own):
            raise no_room(self.site.node_id, size)

    def _early_resume(self, cmd: sb.ResumeSandbox) -> Starter | None:
        sid = cmd.sandbox_id
        if not self.site.host.holds_paused(sid) or not self.early.resumes(
            self.site.bus.sandboxes, cmd
        ):
            return None
        return lambda: self._bring_back(sid, None)

    async def _resume_work(
        self, cmd: sb.ResumeSandbox, state: sb.Sandbox, ctx: MessageContext
    ) -> Outcome:
        error, _ = await self._bring_back(cmd.sandbox_id, state)
        return error, None

    def _resumed(
        self, cmd: sb.ResumeSandbox, error: str | None, code: sb.FailureCode | None
    ) -> sb.CompleteResume:
        failpoint("resume.before_append")  # (the outcome is appended next)
        return sb.CompleteResume(
            sandbox_id=cmd.sandbox_id,
            node_id=self.site.node_id,
            error=error,
            command_id=completion_id(cmd, "resumed"),
        )

    def _resume_recorded(self, sandbox_id: str) -> None:
        """The log holds the resume: the capture it ran from is released — first in the
        journal (a node killed from here on has a running sandbox's VM to report lost),
        then on disk. Until then a restart rolls the sandbox back to it (`reconcile`)."""
        failpoint("resume.before_release")
        self.site.journal.settle(sandbox_id)
        self.site.host.resume_recorded(sandbox_id)

    async def _resume_undone(self, state: sb.Sandbox) -> None:
        """The log failed the resume while this node did it (the fleet's timer took it for
        gone): the VM it brought up goes, and the capture it ran from is held paused again
        as it was — never released as a recorded resume's would be (`failed_meanwhile`)."""
        sid, site = state.sandbox_id, self.site
        async with site.host.lock(sid):
            capture = site.host.held_capture(sid) if await site.host.undo_resume(sid) else None
            if capture is None:  # nothing kept to hold: the node holds nothing of it
                site.journal.remove(sid)
                log.warning("resume of %s failed meanwhile; its VM dropped", sid)
                return
            site.journal.add(sid, state.template_id, capture)
        log.warning("resume of %s failed meanwhile; VM dropped, paused on %s", sid, capture)

    async def _bring_back(self, sandbox_id: str, state: sb.Sandbox | None) -> Started:
        """Restore a paused sandbox here: (error or None, whether this call restored it)."""
        sid, site = sandbox_id, self.site
        host = site.host
        self._on_moot(sid)  # the VM is about to write the RAM file an upload reads
        async with host.lock(sid):
            started = not host.runs(sid)
            try:
                if stale_copy(state, host.held_capture(sid)):
                    # moved away since this node paused it and paused again elsewhere: the
                    # copy here is older than the sandbox — never restore it
                    log.warning("dropping %s's stale local capture: resuming its newer one", sid)
                    await host.kill(sid)
                if not host.holds_paused(sid) and not host.runs(sid):
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
                    taken = state
                    await host.take_over_paused(
                        sid,
                        state.template_id,
                        state.paused_snapshot_id,
                        site.guest_config(state),
                        claim=lambda: move_volumes(site.bus, site.node_id, taken),
                    )
                capture = host.held_capture(sid)  # whole until the resume is recorded
                template = await host.resume(sid)
                if started:  # (a VM already up has its entry)
                    site.journal.add(sid, template, resumed_from=capture)
            except HostError as e:
                return str(e), False
            return None, started


def stale_copy(state: sb.Sandbox | None, held: str | None) -> bool:
    """Whether the capture this node holds (`held`) is not the one the sandbox is paused
    from in the log: it was resumed on another node since, and paused again there."""
    return (
        state is not None
        and held is not None
        and state.paused_snapshot_id is not None
        and held != state.paused_snapshot_id
    )


async def _nothing(cmd: sb.ResumeSandbox) -> None:
    return None  # a resume brings back what is here (or takes it over under its claim)


def _settled(fetch: asyncio.Future[None]) -> None:
    """A fetch that outlived the wait before the claim: its failure is the create's own,
    reported by its restore; only logged here, never left unretrieved."""
    if not fetch.cancelled() and (e := fetch.exception()) is not None:
        log.info("template fetch under a claim failed: %s", e)
