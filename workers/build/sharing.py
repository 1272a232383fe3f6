"""Identical builds of one template share one build (issue 43: eight racing `Template.build`
of one alias run one build sandbox).

A builder that takes a start enters the build's key (`domain.buildkey`, the fingerprint of
what the build depends on) before it claims anything. The log orders builders deciding at
once, on any node: the first entry leads and runs the build; every other build joins it
(`TemplateBuildJoined`), runs nothing, and its start is acked at once — a follower never
holds a builder's slot while it waits. The leader's verdict settles the key and becomes the
verdict of each build that joined it (the same capture published, its own tags added; or the
leader's error). A build started before the leader's verdict that a builder takes after it
(a builder running one build at a time takes the racing starts only then) joins all the
same while the leader's capture is still the template's `default`, and ends at once.

A leader whose builder dies is failed by the next delivery of its start ("the builder
stopped during this build"), as before; its followers fail with it, with the same reason,
and the next build of that spec leads afresh. Every step is idempotent: a builder that dies
between the leader's verdict and its followers' redoes them when the leader's start comes
again.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Literal

from bus import Bus, MessageContext
from bus.decisions import execute
from domain import DomainError
from domain import build as bd
from domain import buildkey as bk
from domain import sandbox as sb
from domain import tags as tg
from domain import template as tp
from envd.version import ENVD_VERSION
from workers.build.bases import base_identity
from workers.build.run import Published

__all__ = ["Sharing"]

log = logging.getLogger(__name__)

Level = Literal["info", "error"]


class Sharing:
    """The builder's side of build keys: which builds lead, and the followers' verdicts."""

    def __init__(self, bus: Bus, published: Published) -> None:
        self.bus = bus
        self.published = published

    async def key_of(self, build: bd.Build) -> str | None:
        """The key of a started build, None if it shares nothing (a forced build)."""
        if build.spec is None:
            return None
        fingerprint = bd.spec_fingerprint(
            team_id=build.team_id,
            template_id=build.template_id,
            base=await base_identity(self.bus, build.spec),
            spec=build.spec,
            cpu_count=build.cpu_count,
            memory_mb=build.memory_mb,
            disk_size_mb=build.disk_size_mb,
        )
        return None if fingerprint is None else bk.build_key_id(fingerprint)

    async def enter(self, build: bd.Build, key_id: str, ctx: MessageContext) -> bk.BuildKey:
        """Lead `key_id` with `build`, or join its leader; the key after the decision."""
        template, _ = await self.bus.templates.load(build.template_id)
        current = None
        if template is not None and not template.deleted:
            current = template.capture_for(tg.DEFAULT_TAG)
        enter = bk.EnterBuildKey(
            key_id=key_id,
            build_id=build.build_id,
            template_id=build.template_id,
            current_capture=current,
            started_at=build.started_at,
        )
        key, _, _ = await execute(self.bus.build_keys, enter, ctx)
        assert key is not None  # entering decides on every state
        return key

    async def follow(self, build: bd.Build, key: bk.BuildKey, ctx: MessageContext) -> None:
        """Record that `build` shares `key.leader`'s result; end it now if that is known."""
        join = bd.JoinTemplateBuild(
            build_id=build.build_id, leader_build_id=key.leader, key_id=key.key_id
        )
        _, _, events = await execute(self.bus.builds, join, ctx)
        if events:
            await self._log(
                build.build_id,
                f"identical to build {key.leader} of {build.template_id}: "
                "sharing its result instead of building again",
            )
        await self.rejoin(build.build_id, key.leader)

    async def rejoin(self, build_id: str, leader_id: str) -> None:
        """End a joined build if its leader has ended (else the leader's settle will)."""
        leader, _ = await self.bus.builds.load(leader_id)
        if leader is not None and leader.finished:
            await self.finish(build_id, leader)

    async def settle(self, leader: bd.Build) -> None:
        """After a leader's verdict: settle its key and give each follower the verdict."""
        if leader.key_id is None or leader.leader_build_id is not None:
            return
        fresh, _ = await self.bus.builds.load(leader.build_id)
        if fresh is None or not fresh.finished:
            return
        ready = fresh.status is bd.BuildStatus.READY
        settle = bk.SettleBuildKey(
            key_id=leader.key_id,
            build_id=leader.build_id,
            error=None if ready else (fresh.reason or "the build failed"),
            step=fresh.failed_step,
            capture_id=tg.build_capture_id(fresh.template_id, fresh.build_id) if ready else None,
            command_id=sb.derived_command_id("build-settle", leader.build_id),
        )
        key, _, _ = await execute(self.bus.build_keys, settle)
        if key is None or key.leader != leader.build_id:
            return  # a newer generation: its followers are not this leader's
        for follower in key.followers:
            await self.finish(follower, fresh)

    async def finish(self, build_id: str, leader: bd.Build) -> None:
        """The verdict of a build that joined `leader`, which has ended: ready with the same
        capture (taking its own tags), or failed with the leader's reason."""
        build, _ = await self.bus.builds.load(build_id)
        if build is None or build.finished:
            return
        error, step = leader.reason, leader.failed_step
        if leader.status is bd.BuildStatus.READY:
            error = await self._publish(build, leader)
            if error is not None:
                step = "finalize"
        elif error is None:
            error = "the build it shared failed"
        if error is None:
            await self._log(
                build_id, f"template {build.template_id} is ready (build {leader.build_id})"
            )
        else:
            await self._log(build_id, f"build {leader.build_id} failed: {error}", level="error")
        done = bd.CompleteTemplateBuild(
            build_id=build_id,
            error=error,
            step=step,
            envd_version=leader.envd_version or ENVD_VERSION,
            command_id=sb.derived_command_id("build-follow", build_id),
        )
        await execute(self.bus.builds, done)

    async def _publish(self, build: bd.Build, leader: bd.Build) -> str | None:
        """Give a follower's tags to the shared capture (the leader published `default`);
        the reason it could not, or None."""
        if not build.tags:
            return None
        capture_id = tg.build_capture_id(leader.template_id, leader.build_id)
        capture, _ = await self.bus.templates.load(capture_id)
        if capture is None or capture.deleted:
            return f"the shared capture {capture_id} is gone"
        publish = tp.PublishTemplateBuild(
            template_id=build.template_id,
            alias=build.alias,
            envd_version=capture.envd_version,
            cpu_count=capture.cpu_count,
            memory_mb=capture.memory_mb,
            disk_size_mb=capture.disk_size_mb,
            build_id=leader.build_id,
            capture_id=capture_id,
            tags=build.tags,
            command_id=sb.derived_command_id("build-publish", build.build_id),
        )
        try:
            await execute(self.bus.templates, publish)
        except DomainError as e:
            return f"the build could not be published: {e}"
        self.published(build.template_id)
        return None

    async def _log(self, build_id: str, message: str, level: Level = "info") -> None:
        entry = bd.BuildLogEntry(at=datetime.now(UTC), level=level, message=message)
        try:
            await execute(self.bus.builds, bd.LogTemplateBuild(build_id=build_id, entries=(entry,)))
        except Exception as e:  # a lost log line must not fail the build
            log.warning("build %s: log append failed: %s", build_id, e)
