"""The builder service: takes `StartTemplateBuild` commands from `aenv.cmd.build.*` (one
durable consumer shared by every builder), claims the build on its aggregate, records its
progress there and runs it (`run.BuildRun`).

The API records the start before it answers (the build is `building`, queued); a builder
that takes it claims it (`ClaimTemplateBuild`). A build runs at most once: a redelivered
start whose build is already claimed means the builder that ran it died mid-way; the build
is failed with that reason (its sandbox killed) rather than run twice over a half-built
guest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

from bus import Bus, CommandConsumer, ConsumerSpec, Delivery, MessageContext
from bus.decisions import execute
from domain import Invalid
from domain import build as bd
from envd.version import ENVD_VERSION
from workers.build.metrics import BuildMetrics
from workers.build.run import BuildRun, BuildSettings, Published, build_sandbox_id
from workers.build.sharing import Sharing

__all__ = ["BuildSettings", "Builder"]

log = logging.getLogger(__name__)


class Builder:
    def __init__(
        self,
        bus: Bus,
        settings: BuildSettings,
        *,
        parallel: int = 1,
        published: Published | None = None,
        metrics: BuildMetrics | None = None,
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.parallel = parallel
        #: told the template a build was published to (the API beside it forgets its
        #: lookups of the name: `default` moved)
        self.published: Published = published or (lambda _: None)
        self.sharing = Sharing(bus, self.published)
        self._consumer: CommandConsumer | None = None
        self.metrics = metrics or BuildMetrics()
        self.metrics.count_queue(self._waiting)

    async def _waiting(self) -> int:
        """Starts in the builders' queue no builder took yet."""
        names = self.bus.names
        info = await self.bus.js.consumer_info(names.command_stream, names.build_consumer)
        return info.num_pending or 0

    async def start(self) -> None:
        spec = ConsumerSpec(
            durable=self.bus.names.build_consumer,
            filter_subject=self.bus.names.build_commands,
            max_ack_pending=self.parallel,
            max_deliver=3,
            backoff=(30.0, 60.0),
        )
        self._consumer = CommandConsumer(
            self.bus.js, self.bus.settings, spec, self.handle, self.bus.rejection_sinks
        )
        await self._consumer.start()

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    async def handle(self, d: Delivery) -> None:
        cmd = d.command
        if not isinstance(cmd, bd.StartTemplateBuild):
            raise Invalid(f"{type(cmd).__name__} is not a builder command")
        ctx = d.context
        state, _ = await self.bus.builds.load(cmd.build_id)
        if state is not None and state.leader_build_id is not None:
            # a joined build's start again: its leader's verdict is its own, once given
            await self.sharing.rejoin(state.build_id, state.leader_build_id)
            return
        if state is not None and state.status is bd.BuildStatus.BUILDING and not state.queued:
            await self._verdict(
                state, ctx, "the builder stopped during this build; start a new build", None
            )
            return
        # recorded by the API already (then nothing new), unless this builder was quicker
        state, version, _ = await execute(self.bus.builds, cmd, ctx)
        if state is None or state.finished:
            if state is not None:  # a leader's start again: its followers may wait still
                await self.sharing.settle(state)
            return  # already finished (a duplicate start)
        # identical builds of the template share one: the key's leader runs it, the others
        # join it and are acked now (they end with its verdict, `workers/build/sharing.py`)
        key_id = await self.sharing.key_of(state)
        if key_id is not None:
            key = await self.sharing.enter(state, key_id, ctx)
            if key.leader != state.build_id:
                await self.sharing.follow(state, key, ctx)
                return
        # of two builders claiming at once (a start queued twice), one appends; the other's
        # append fails its expected sequence (or is a stale duplicate), and deciding again
        # on the claimed build gives nothing
        claim = bd.ClaimTemplateBuild(build_id=cmd.build_id, key_id=key_id)
        state, _, events = await execute(self.bus.builds, claim, ctx, known=(state, version))
        if state is None or not events:
            return  # claimed by another builder meanwhile
        await self._run(state, ctx)

    async def _run(self, build: bd.Build, ctx: MessageContext) -> None:
        log_lock = asyncio.Lock()

        async def emit(message: str, step: str | None, level: str) -> None:
            entry = bd.BuildLogEntry(
                at=datetime.now(UTC),
                level=level,
                message=message,
                step=step,
            )
            async with log_lock:
                try:
                    line = bd.LogTemplateBuild(build_id=build.build_id, entries=(entry,))
                    await execute(self.bus.builds, line, ctx)
                except Exception as e:  # a lost log line must not fail the build
                    log.warning("build %s: log append failed: %s", build.build_id, e)

        run = BuildRun(self.bus, self.settings, build, emit, self.published)
        t0 = time.monotonic()
        self.metrics.running.inc()
        try:
            error, step = await run.execute()
        except Exception as e:
            log.exception("build %s crashed", build.build_id)
            error, step = f"internal builder error: {e}", None
        finally:
            self.metrics.running.dec()
        await self._verdict(build, ctx, error, step)
        self.metrics.built(time.monotonic() - t0, ok=error is None)
        log.info(
            "build %s %s in %.1f s",
            build.build_id,
            "ready" if error is None else f"failed at {step or '?'}",
            time.monotonic() - t0,
        )

    async def _verdict(
        self, build: bd.Build, ctx: MessageContext, error: str | None, step: str | None
    ) -> None:
        done = bd.CompleteTemplateBuild(
            build_id=build.build_id,
            error=error,
            step=step,
            sandbox_id=build_sandbox_id(build.build_id),
            envd_version=ENVD_VERSION,
        )
        await execute(self.bus.builds, done, ctx)
        await self.sharing.settle(build)
