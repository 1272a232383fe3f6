"""The repository janitor: manifests go with what they describe (images-at-scale S11).

One durable consumer of the event log shared by every node (`repo-janitor`): JetStream
hands each event to one of them, so a fleet deletes each manifest once, and a node that
dies mid-way leaves the event to be delivered again (deletes are idempotent).

- `SandboxKilled`: the sandbox's pause captures (every `SandboxPaused` of its history) and
  the volume images uploaded beside them (`<capture>-v<slot>`); the templates its forks
  lent those captures to (`paused-<capture>`) are deleted first, in the log and on the nodes;
- `TemplateDeleted` / `TemplateCaptureDropped`: the template's capture (`capture_key`);
- `ImageForgotten`: `image-<digest>`, unless the image was published again since or a
  capture names it (an operator's forget: a capture's base image keeps its manifest); and
  its read trace `image-<digest>.trace` with it (the block service's prefetch list).

`forget_images` is the other half, run with the blob GC under its lease (`gcrun.py`): an
image no capture names, past its grace, is forgotten in the log and its manifest deleted
(its trace with it), and a trace whose image is gone is deleted too.
What the deleted manifests named becomes garbage for the next `collect_garbage`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from datetime import UTC, datetime, timedelta

from bus import Bus, ConsumerSpec, MessageContext, RetryableError
from bus.decisions import execute
from bus.event_consumer import EventConsumer, EventDelivery
from bus.nodes import NodeBook
from bus.records import RecordedEvent
from domain import NotFound
from domain import image as im
from domain import sandbox as sb
from domain import template as tp
from workers.snapshot import paths
from workers.snapshot.errors import LayoutError, ManifestNotFound
from workers.snapshot.gcmetrics import GcMetrics
from workers.snapshot.leftovers import (
    StoredImage,
    capture_keys,
    dropped_capture_key,
    images_to_forget,
    named_images,
    orphan_traces,
    pause_keys,
)
from workers.snapshot.manifest import ImageManifest, SnapshotManifest, parse_manifest
from workers.snapshot.retry import RetryPolicy, retrying
from workers.snapshot.store import SnapshotStore

__all__ = ["JANITOR", "RepositoryJanitor"]

log = logging.getLogger(__name__)

#: The durable consumer's name (namespaced by the bus prefix).
JANITOR = "repo-janitor"
#: Redelivery while the store is down: 2 s … 5 minutes, for weeks.
BACKOFF = (2.0, 6.0, 18.0, 54.0, 162.0, 300.0)
ATTEMPTS = 10_000
#: A kill is tidied this long after it happened: the node cancels an upload of the
#: sandbox's capture when it is killed, but a manifest PUT already in flight may land
#: after the kill; deleted before it lands, it would stay for good.
KILL_SETTLE_S = 30.0
#: A consumer created now starts this far back (a fleet upgraded to S11 tidies the last
#: day's kills; older leftovers stay until an operator deletes them).
START_BACK = timedelta(days=1)


class RepositoryJanitor:
    """Deletes the manifests of what the log says is gone."""

    def __init__(
        self,
        bus: Bus,
        store: SnapshotStore,
        *,
        retry: RetryPolicy | None = None,
        metrics: GcMetrics | None = None,
        kill_settle_s: float = KILL_SETTLE_S,
    ) -> None:
        self.bus = bus
        self.kill_settle_s = kill_settle_s
        self.store = store
        self.retry = retry or RetryPolicy()
        self.metrics = metrics or GcMetrics()
        self._consumer: EventConsumer | None = None

    def spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable=self.bus.names.durable(JANITOR),
            filter_subject=self.bus.names.all_events,
            max_deliver=ATTEMPTS,
            backoff=BACKOFF,
            # every kill waits `kill_settle_s` unacked: a fleet's burst of kills must not
            # hold up the events behind it (a handler is busy only while it deletes)
            max_ack_pending=10_000,
            parallel=8,
            start_time=datetime.now(UTC) - START_BACK,
        )

    async def start(self) -> None:
        self._consumer = EventConsumer(self.bus.js, self.bus.settings, self.spec(), self.handle)
        await self._consumer.start()

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    async def handle(self, d: EventDelivery) -> None:
        if isinstance(d.record.event, sb.SandboxKilled) and d.age_s < self.kill_settle_s:
            raise RetryableError("kill too recent to tidy", delay_s=self.kill_settle_s - d.age_s)
        await self.tidy(d.record)

    async def tidy(self, rec: RecordedEvent) -> list[str]:
        """Delete what `rec` leaves describing nothing; the manifest ids deleted."""
        match rec.event:
            case sb.SandboxKilled(sandbox_id=sid):
                return await self.sandbox_killed(sid)
            case tp.TemplateDeleted() | tp.TemplateCaptureDropped() as event:
                return await self._template(rec, event)
            case im.ImageForgotten(digest=str(digest)) as event:
                state, _ = await self.bus.images.load(event.image_id)
                if state is not None and state.published and state.published.digest == digest:
                    return []  # published again since (the same bytes): still named
                if digest in named_images((await self._scan())[0]):
                    return []  # a capture restores over these bytes (a forget by hand)
                return await self._delete_image(digest)
            case _:
                return []

    async def sandbox_killed(self, sandbox_id: str) -> list[str]:
        history = await self.bus.sandboxes.read(sandbox_id)
        captures = [
            r.event.snapshot_id
            for r in history
            if isinstance(r.event, sb.SandboxPaused) and r.event.snapshot_id is not None
        ]
        if not captures:
            return []
        await self._lent_templates(captures)
        requested = [r.event for r in history if isinstance(r.event, sb.SandboxRequested)]
        if requested:  # its mounts say which volume images its pauses uploaded
            keys = capture_keys(captures, len(requested[0].spec.volume_mounts))
        else:  # a history without its request: what the store holds (a listing of it)
            keys = pause_keys(captures, await retrying(self.store.list_manifests, self.retry))
        return await self._delete(keys, "pause")

    async def _lent_templates(self, captures: list[str]) -> None:
        """The templates a killed sandbox's pause captures were lent to by its forks
        (`api/pausefork.py`): deleted in the log and on every node (those that took
        children hold a copy of the capture). Their manifests are the sandbox's, deleted
        next. A redelivery sends the nodes' deletes again (the same derived ids)."""
        nodes: list[str] | None = None  # read once, and only if a capture was lent
        for capture in captures:
            name = tp.paused_capture_template(capture)
            state, _ = await self.bus.templates.load(name)
            if state is None:
                continue  # never forked
            delete = tp.DeleteTemplate(
                template_id=name, command_id=sb.derived_command_id("lent-capture", capture)
            )
            with contextlib.suppress(NotFound):  # deleted already (a tidy cut short)
                await execute(self.bus.templates, delete)
            if nodes is None:
                book = await NodeBook.open(self.bus.js, self.bus.names.nodes_bucket)
                nodes = [b.node_id for b in await book.all()]
            await self.bus.commands.to_each_node(nodes, delete)

    async def _template(
        self, rec: RecordedEvent, event: tp.TemplateDeleted | tp.TemplateCaptureDropped
    ) -> list[str]:
        history = await self.bus.templates.read(event.template_id)
        uploads = [
            r.event.key
            for r in history
            if r.seq < rec.seq and isinstance(r.event, tp.TemplateUploaded)
        ]
        now = tp.fold_template(r.event for r in history)
        key = dropped_capture_key(event, uploads[-1] if uploads else None, now)
        return await self._delete([key], "template") if key is not None else []

    async def forget_images(self, *, grace: timedelta, now: datetime | None = None) -> list[str]:
        """Forget every image no capture names, older than `grace`: in the log (its
        recipe's aggregate back to empty, so the next use builds or shares it again) and in
        the store. The content digests forgotten."""
        captures, images = await self._scan()
        gone = images_to_forget(
            images, named_images(captures), now=now or datetime.now(UTC), grace=grace
        )
        out: list[str] = []
        for image in gone:
            if await self._forget(image):
                out.append(image.digest)
        stored = await retrying(self.store.list_manifests, self.retry)
        await self._delete(orphan_traces(stored), "trace")
        return out

    async def _scan(self) -> tuple[list[SnapshotManifest], list[StoredImage]]:
        """Every capture manifest and every image in the store."""
        captures: list[SnapshotManifest] = []
        images: list[StoredImage] = []
        for mid in await retrying(self.store.list_manifests, self.retry):
            m = await self._read(mid)
            if isinstance(m, SnapshotManifest):
                captures.append(m)
            elif isinstance(m, ImageManifest):
                images.append(StoredImage(m.digest, m.recipe, m.created_at))
        return captures, images

    async def _forget(self, image: StoredImage) -> bool:
        iid = im.image_aggregate_id(image.recipe)
        state, _ = await self.bus.images.load(iid)
        if state is not None and state.published and state.published.digest == image.digest:
            forget = im.ForgetImage(
                image_id=iid,
                command_id=sb.derived_command_id("image-forget", iid, image.digest),
            )
            try:
                await execute(self.bus.images, forget, MessageContext())
            except im.ClaimHeld:  # a build of the recipe is running: next round
                return False
        await self._delete_image(image.digest)
        log.info("image %s (recipe %s) forgotten: no capture names it", image.digest, image.recipe)
        return True

    async def _read(self, mid: str) -> SnapshotManifest | ImageManifest | None:
        try:
            data = await retrying(functools.partial(self.store.get_manifest, mid), self.retry)
        except ManifestNotFound:
            return None
        try:
            m = parse_manifest(data)
        except ValueError as e:  # a capture we cannot read may name any image: keep all
            raise LayoutError(f"manifest {mid}: unreadable: {e}") from e
        return m if isinstance(m, SnapshotManifest | ImageManifest) else None

    async def _delete_image(self, digest: str) -> list[str]:
        """The image's manifest, then its trace (a trace left by a crash in between is an
        orphan the next GC round sweeps)."""
        gone = await self._delete([paths.image_key(digest)], "image")
        return gone + await self._delete([paths.trace_key(digest)], "trace")

    async def _delete(self, keys: list[str], kind: str) -> list[str]:
        for key in keys:
            await retrying(functools.partial(self.store.delete_manifest, key), self.retry)
            self.metrics.manifest_deleted(kind)
            log.info("repository: deleted %s manifest %s", kind, key)
        return keys
