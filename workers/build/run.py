"""One template build, start to verdict: a build sandbox from the base template (a normal
`CreateSandbox` through the bus), the steps through its envd, the start/ready commands, a
persistent snapshot as the build's own capture (a normal `SnapshotSandbox`, named
`<template>:<build id>`), then the build sandbox is killed. The capture is published to
the template — it becomes `default` and takes the build's tags (`domain/tags.py`) — so
older builds stay startable by their tags. Every step writes log lines; any failure ends
the build with a reason naming the step.

Steps run as root unless a USER step (or a RUN's own user) says otherwise, like Docker;
the template's default user is the last USER, else `user` (E2B's sandbox user).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bus import Bus, MessageContext
from bus.decisions import execute
from domain import CommandRejected, DomainError, Event
from domain import build as bd
from domain import sandbox as sb
from domain import tags as tg
from domain import template as tp
from shared.images import InvalidImageReference, image_template_id, parse_reference
from workers.build.bases import base_template
from workers.build.guest import BuildGuest, CommandFailed
from workers.build.steps import Context, Log, StepFailed, Steps

__all__ = ["BuildRun", "BuildSettings", "Published", "StepFailed", "build_sandbox_id"]

log = logging.getLogger(__name__)

Published = Callable[[str], None]  # (template id)

#: E2B's sandbox user: the default of a template that sets no USER.
SANDBOX_USER = "user"
BUILDER_TEAM = "aenv-build"  # build sandboxes (and their snapshots) stay out of user listings


@dataclass
class BuildSettings:
    proxy_url: str
    files_dir: Path
    step_timeout_s: float = 1800.0
    ready_timeout_s: float = 120.0
    create_timeout_s: float = 300.0
    import_timeout_s: float = 900.0
    sandbox_ttl_s: int = 3 * 3600


def build_sandbox_id(build_id: str) -> str:
    """Derived from the build: a redelivered build finds (and kills) its predecessor's VM."""
    return sb.derived_sandbox_id(f"build|{build_id}")


async def _send(
    bus: Bus,
    cmd: sb.SandboxCommand,
    node_id: str | None,
    until: tuple[type[Event], ...],
    timeout: float,
) -> Event:
    """Publish a sandbox command and wait for its outcome event (or a rejection)."""
    rec = await bus.send_and_wait(
        cmd, node_id=node_id, until=until, timeout=timeout, actor="builder"
    )
    if rec is None:
        raise TimeoutError(f"{type(cmd).__name__} got no answer within {timeout:.0f}s")
    return rec.event


class BuildRun:
    def __init__(
        self,
        bus: Bus,
        settings: BuildSettings,
        build: bd.Build,
        emit: Log,
        published: Published = lambda _: None,
    ) -> None:
        self.bus, self.settings, self.build, self.emit = bus, settings, build, emit
        self.published = published
        assert build.spec is not None
        self.spec: bd.BuildSpec = build.spec
        self.sandbox_id = build_sandbox_id(build.build_id)
        #: the template this build's capture is registered as (what its tags will name)
        self.capture_id = tg.build_capture_id(build.template_id, build.build_id)
        self.node_id: str | None = None
        self.guest: BuildGuest | None = None
        self.ctx = Context()
        self.imported = False
        #: the node holding the capture once taken, until it is published
        self.unpublished: str | None = None

    async def execute(self) -> tuple[str | None, str | None]:
        """Run the build; (error, failed step) — (None, None) when the template is ready."""
        try:
            await self._base()
            if not self.imported:
                steps = self._steps()
                for i, step in enumerate(self.spec.steps, 1):
                    await steps.run(str(i), step)
                await self._finalize()
            await self._publish()
            return None, None
        except StepFailed as e:
            await self.emit(f"build failed: {e.reason}", e.step, "error")
            return e.reason, e.step
        finally:
            await self._cleanup()

    # ---- base ---------------------------------------------------------------------------
    async def _base(self) -> None:
        bad = [
            (str(i), st.type)
            for i, st in enumerate(self.spec.steps, 1)
            if st.type not in bd.STEP_TYPES
        ]
        if bad:  # fail before starting anything
            step, kind = bad[0]
            raise StepFailed(
                step,
                f"unsupported instruction {kind!r} (supported: {', '.join(sorted(bd.STEP_TYPES))})",
            )
        if self.spec.from_image is not None:
            name = await self._import(self.spec.from_image)
            if name == self.capture_id:
                self.imported = True  # `aenv pull`: the image is the build's capture
                return
        else:
            name = self.spec.from_template or "base"
        tpl = await base_template(self.bus, name)
        if tpl is None:
            raise StepFailed("base", f"base template {name!r} not found")
        await self.emit(f"FROM {name}: starting the build sandbox", "base", "info")
        token = secrets.token_urlsafe(24)
        create = sb.CreateSandbox(
            sandbox_id=self.sandbox_id,
            template_id=tpl.template_id,
            alias=tpl.alias or tg.shown_template(tpl.template_id),
            team_id=BUILDER_TEAM,
            cpu_count=tpl.cpu_count,
            memory_mb=tpl.memory_mb,
            disk_size_mb=tpl.disk_size_mb,
            envd_version=tpl.envd_version,
            envd_access_token=token,
            timeout_s=self.settings.sandbox_ttl_s,
            metadata={"aenv.build": self.build.build_id, "aenv.template": self.build.template_id},
            lifecycle=sb.Lifecycle(on_timeout="kill"),
            command_id=sb.derived_command_id("build-create", self.build.build_id),
        )
        try:
            event = await _send(
                self.bus,
                create,
                self.spec_node(),
                (sb.SandboxCreated,),
                self.settings.create_timeout_s,
            )
        except TimeoutError as e:
            raise StepFailed("base", f"the build sandbox did not start: {e}") from e
        if isinstance(event, sb.SandboxFailed | CommandRejected):
            reason = event.reason
            raise StepFailed("base", f"the build sandbox did not start: {reason}")
        assert isinstance(event, sb.SandboxCreated)
        self.node_id = event.node_id
        self.guest = BuildGuest(self.settings.proxy_url, self.sandbox_id, tpl.envd_version, token)

    async def _import(self, image: str) -> str:
        """The template an image becomes: the build's capture (nothing else to do) or an
        intermediate one named by the image (reused while a local file is unchanged, and
        for a registry reference as Docker reuses a pulled image: until a build forces it)."""
        path = Path(image)
        source: dict[str, str | None]
        if path.is_absolute():
            if not path.exists():
                raise StepFailed("base", f"FROM {image}: no such OCI layout or archive")
            st = path.stat()
            identity = f"{path}|{st.st_size}|{st.st_mtime_ns}"
            image_id = f"img-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"
            source = {"image_path": str(path)}
        else:
            try:
                ref = str(parse_reference(image))
            except InvalidImageReference as e:
                raise StepFailed("base", f"FROM {image}: {e}") from e
            # the name a create of this image imports it as, too (`api/images.py`)
            image_id = image_template_id(ref, self.spec.from_image_username)
            login = self.build.build_id if self.spec.from_image_username else None
            source = {"image_ref": ref, "credentials": login}
        plain = not self.spec.steps and not self.spec.start_cmd and not self.spec.ready_cmd
        # the build's `minFreeDiskMb` (0: not asked, the node's default) sizes the image's
        # root disk; an image imported with another free space is another template
        free_mb = self.build.disk_size_mb or None
        if free_mb is not None:
            sized = f"{image_id}|free={free_mb}"
            image_id = f"img-{hashlib.sha256(sized.encode()).hexdigest()[:16]}"
        name = self.capture_id if plain else image_id
        forced = self.spec.force or any(st.force for st in self.spec.steps)
        if not plain and not forced:
            existing, _ = await self.bus.templates.load(name)
            if existing is not None and not existing.deleted:
                await self.emit(f"FROM {image}: already imported as {name}", "base", "info")
                return name
        await self.emit(
            f"FROM {image}: pulling and converting the image, booting it once (a minute or two)",
            "base",
            "info",
        )
        cmd = tp.ImportTemplateImage(
            template_id=name,
            alias=None,
            build_id=self.build.build_id,
            **source,
            cpu_count=self.build.cpu_count,
            memory_mb=self.build.memory_mb,
            disk_free_mb=free_mb,
            command_id=sb.derived_command_id("build-import", self.build.build_id),
        )
        version = await self.bus.templates.version(name)
        waiter = asyncio.create_task(
            self.bus.templates.wait_for_outcome(
                name,
                cmd.command_id,
                version.seq,
                (tp.TemplateImported,),
                self.settings.import_timeout_s,
            )
        )
        await asyncio.sleep(0)
        await self.bus.commands.to_placement(cmd, context=MessageContext(actor="builder"))
        rec = await waiter
        if rec is None:
            raise StepFailed(
                "base",
                f"FROM {image}: no node imported it within {self.settings.import_timeout_s:.0f}s",
            )
        if isinstance(rec.event, CommandRejected):
            raise StepFailed("base", f"FROM {image}: {rec.event.reason}")
        if plain and isinstance(rec.event, tp.TemplateImported):
            self.unpublished = rec.event.node_id
        await self.emit(f"FROM {image}: imported as template {name}", "base", "info")
        return name

    def spec_node(self) -> str | None:
        return self.build.node_id

    # ---- steps --------------------------------------------------------------------------
    def _steps(self) -> Steps:
        """The steps run in the build sandbox, which `_base` has started."""
        assert self.guest is not None
        return Steps(
            self.guest,
            self.ctx,
            self.emit,
            self.build,
            total=len(self.spec.steps),
            files_dir=self.settings.files_dir,
            step_timeout_s=self.settings.step_timeout_s,
        )

    # ---- finalize -----------------------------------------------------------------------
    async def _finalize(self) -> None:
        assert self.guest is not None
        step = "finalize"
        user = self.ctx.user or SANDBOX_USER
        try:
            await self.guest.set_defaults(self.ctx.env, user, self.ctx.workdir)
        except Exception as e:
            raise StepFailed(step, f"could not set the template's defaults: {e}") from e
        if self.spec.start_cmd:
            await self.emit(f"start command: {self.spec.start_cmd}", step, "info")
            try:
                await self.guest.start(
                    self.spec.start_cmd, user=user, cwd=self.ctx.workdir, envs=self.ctx.env
                )
            except Exception as e:
                raise StepFailed(step, f"start command failed to start: {e}") from e
        if self.spec.ready_cmd:
            await self._wait_ready(step, user)
        await self.emit("capturing the template snapshot", step, "info")
        snap = sb.SnapshotSandbox(
            sandbox_id=self.sandbox_id,
            snapshot_id=self.capture_id,
            command_id=sb.derived_command_id("build-snapshot", self.build.build_id),
        )
        try:
            event = await _send(
                self.bus,
                snap,
                self.node_id,
                (sb.SnapshotTaken, sb.SnapshotFailed),
                self.settings.create_timeout_s,
            )
        except TimeoutError as e:
            raise StepFailed(step, f"snapshot: {e}") from e
        if isinstance(event, sb.SnapshotFailed | sb.SandboxFailed | CommandRejected):
            raise StepFailed(step, f"snapshot failed: {event.reason}")
        self.unpublished = self.node_id

    async def _publish(self) -> None:
        """The build's capture (registered by the node that took it) becomes the
        template's `default` and takes the build's tags: from now on `Sandbox.create(name)`
        starts it, and the capture `default` named before is released if no tag is left on
        it (dropped by the API after its grace)."""
        step = "finalize"
        capture, _ = await self.bus.templates.load(self.capture_id)
        if capture is None or capture.deleted:
            raise StepFailed(step, f"the build's capture {self.capture_id} was not registered")
        publish = tp.PublishTemplateBuild(
            template_id=self.build.template_id,
            alias=self.build.alias,
            envd_version=capture.envd_version,
            cpu_count=capture.cpu_count,
            memory_mb=capture.memory_mb,
            disk_size_mb=capture.disk_size_mb,
            build_id=self.build.build_id,
            capture_id=self.capture_id,
            tags=self.build.tags,
            command_id=sb.derived_command_id("build-publish", self.build.build_id),
        )
        try:
            await execute(self.bus.templates, publish)
        except DomainError as e:
            raise StepFailed(step, f"the build could not be published: {e}") from e
        self.unpublished = None
        self.published(self.build.template_id)
        names = ", ".join(
            f"{self.build.template_id}:{t}"
            for t in dict.fromkeys([*self.build.tags, tg.DEFAULT_TAG])
        )
        await self.emit(f"template {self.build.template_id} is ready ({names})", step, "info")

    async def _wait_ready(self, step: str, user: str) -> None:
        assert self.guest is not None and self.spec.ready_cmd is not None
        await self.emit(f"waiting for: {self.spec.ready_cmd}", step, "info")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.ready_timeout_s
        last = ""
        while loop.time() < deadline:
            try:
                await self.guest.run(
                    self.spec.ready_cmd,
                    user=user,
                    cwd=self.ctx.workdir,
                    envs=self.ctx.env,
                    timeout=30,
                    output=lambda _s, _l: None,
                )
                return
            except CommandFailed as e:
                last = str(e)
            await asyncio.sleep(1.0)
        raise StepFailed(
            step,
            f"ready command did not succeed within {self.settings.ready_timeout_s:.0f}s ({last})",
        )

    async def _cleanup(self) -> None:
        """Kill the build sandbox whatever happened (its capture, if published, is the
        build's); a capture taken but never published is nobody's: deleted."""
        if self.unpublished is not None:
            await self._discard(self.unpublished)
        state, _ = await self.bus.sandboxes.load(self.sandbox_id)
        if state is None or state.status in (sb.SandboxStatus.KILLED, sb.SandboxStatus.FAILED):
            return
        kill = sb.KillSandbox(
            sandbox_id=self.sandbox_id,
            command_id=sb.derived_command_id("build-kill", self.build.build_id),
        )
        try:
            await _send(self.bus, kill, state.node_id, (sb.SandboxKilled,), 60)
        except Exception as e:  # the TTL kills it later anyway
            log.warning("build %s: could not kill %s: %s", self.build.build_id, self.sandbox_id, e)

    async def _discard(self, node_id: str) -> None:
        delete = tp.DeleteTemplate(
            template_id=self.capture_id,
            command_id=sb.derived_command_id("build-discard", self.build.build_id),
        )
        try:
            await execute(self.bus.templates, delete)
            await self.bus.commands.to_node(node_id, delete)
        except Exception as e:  # best effort: an orphan capture costs disk, not correctness
            log.warning(
                "build %s: could not discard %s: %s", self.build.build_id, self.capture_id, e
            )
