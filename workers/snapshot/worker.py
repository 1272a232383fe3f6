"""The snapshot worker: makes a node's captures durable in the snapshot repository.

Per-node durable JetStream consumers of the sandbox and template events (`EventConsumer`):
a `SandboxPaused` whose capture is on this node is uploaded, then `SnapshotUploaded` is
appended (`RecordUpload`); a `SnapshotTaken` (a persistent snapshot, a build's capture) or
a `TemplateImported` (`aenv pull`, a build FROM an image) on this node uploads the
template's capture and records where it is durable (`RecordTemplateUpload` →
`TemplateUploaded`): from then on creates of it go to any node, which fetches it.
JetStream does the bookkeeping the node once did by hand: the event is acked only once the
capture is durable or moot, so an upload cut short by a crash or a dead S3 is delivered
again (backoff up to 5 minutes, for a month) — after a restart too.

The worker never touches VMs or the node's disk layout: what it needs of the node is the
`LocalCaptures` port (where a capture lies, whether it still matters), which the node role
hands it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

from bus import Bus, ConsumerSpec, MessageContext, RetryableError
from bus.decisions import execute
from bus.event_consumer import EventConsumer, EventDelivery
from bus.failpoints import failpoint
from bus.nodes import describe_uploads
from bus.subjects import AggregateKind
from domain import sandbox as sb
from domain import template as tp
from workers.snapshot.backlog import UploadBacklog

__all__ = [
    "PAUSE_UPLOAD_DELAY_S",
    "CaptureStore",
    "LocalCapture",
    "LocalCaptures",
    "SnapshotWorker",
    "TemplateSource",
]

log = logging.getLogger(__name__)

#: A pause's upload starts this long after the pause: an agent that resumes within it (a
#: short wait on the model) costs the node no upload at all.
PAUSE_UPLOAD_DELAY_S = 2.0
#: Redelivery after a failed upload (S3 down): 2 s, 6 s, 18 s, ... capped at 5 minutes.
UPLOAD_BACKOFF = (2.0, 6.0, 18.0, 54.0, 162.0, 300.0)
#: Deliveries of one event: "until durable" in practice (a month of 5-minute retries).
#: Not unlimited (-1): JetStream before 2.10 refuses that beside a backoff list.
UPLOAD_ATTEMPTS = 10_000
#: A consumer created now starts this far back in the log: a node upgraded or restarted
#: with captures whose upload never finished finds their events again.
START_BACK = timedelta(hours=1)


class LocalCapture(Protocol):
    """A capture on this node's disk, ready to read."""

    @property
    def snapshot_id(self) -> str: ...

    @property
    def dir(self) -> Path: ...

    @property
    def base_image_digest(self) -> str: ...

    @property
    def size_bytes(self) -> int: ...

    @property
    def image_bytes(self) -> int:
        """Allocated bytes of the image and runtime disks the capture stacks on: what a
        node without them fetches besides the capture (placement by disk counts both)."""
        ...

    @property
    def volumes(self) -> tuple[tuple[int, str, Path], ...]:
        """(slot, volume id, image) of the volumes a paused sandbox holds: uploaded with
        its capture (`<capture>-v<slot>`), since a take-over on another node needs them."""
        ...


class TemplateSource(Protocol):
    """What a node knows of a template capture it marked durable."""

    @property
    def sandbox_id(self) -> str | None:
        """The sandbox it was taken of (None: an imported image, no sandbox's token in
        its guest)."""
        ...


class LocalCaptures(Protocol):
    """The node's side of the port."""

    async def paused_capture(self, sandbox_id: str, snapshot_id: str) -> LocalCapture | None:
        """The paused sandbox's capture if it is on this node and still its paused state
        (None: resumed, killed, never here), once nothing writes to it any more."""

    def template_capture(self, name: str) -> LocalCapture | None:
        """The current capture of template `name` on this node (a snapshot's or an
        import's; None: not here, deleted)."""

    def template_uploaded(self, name: str, snapshot_id: str) -> TemplateSource | None:
        """Record that template `name`'s capture `snapshot_id` is durable; where it came
        from, or None if the name has moved on to a newer capture meanwhile."""


class CaptureStore(Protocol):
    """What the worker needs of the snapshot repository (`SnapshotRepository`)."""

    async def upload(
        self, snapshot_dir: Path, *, base_image_digest: str, snapshot_id: str
    ) -> object: ...

    async def upload_volume(self, image: Path, *, key: str, volume_id: str) -> object: ...


class SnapshotWorker:
    """Uploads this node's captures as their events arrive; `cancel` stops one that became
    moot mid-way (the node resumes or kills its sandbox)."""

    def __init__(
        self,
        bus: Bus,
        node_id: str,
        captures: LocalCaptures,
        repository: CaptureStore,
        *,
        pause_delay_s: float = PAUSE_UPLOAD_DELAY_S,
    ) -> None:
        self.bus = bus
        self.node_id = node_id
        self.captures = captures
        self.repository = repository
        self.pause_delay_s = pause_delay_s
        self._uploads: dict[str, asyncio.Task[None]] = {}
        self._consumers: list[EventConsumer] = []
        #: failed uploads waiting for their redelivery (the heartbeat reports it)
        self.backlog = UploadBacklog()

    def waiting(self) -> tuple[int, float]:
        """(captures whose upload failed and waits for a retry, oldest wait in seconds)."""
        return self.backlog.summary(time.monotonic())

    def spec(self) -> ConsumerSpec:
        """Of the sandbox events: pauses, persistent snapshots."""
        names = self.bus.names
        return self._spec(names.snapshot_consumer(self.node_id), AggregateKind.SANDBOX)

    def template_spec(self) -> ConsumerSpec:
        """Of the template events: imports (one consumer filters one aggregate kind)."""
        names = self.bus.names
        return self._spec(names.snapshot_template_consumer(self.node_id), AggregateKind.TEMPLATE)

    def _spec(self, durable: str, kind: AggregateKind) -> ConsumerSpec:
        return ConsumerSpec(
            durable=durable,
            filter_subject=self.bus.names.events_of_kind(kind),
            max_deliver=UPLOAD_ATTEMPTS,
            backoff=UPLOAD_BACKOFF,
            max_ack_pending=8,
            start_time=datetime.now(UTC) - START_BACK,
        )

    async def start(self) -> None:
        for spec in (self.spec(), self.template_spec()):
            consumer = EventConsumer(self.bus.js, self.bus.settings, spec, self.handle)
            await consumer.start()
            self._consumers.append(consumer)

    async def stop(self) -> None:
        """Uploads in flight are abandoned: their events are delivered again later."""
        for task in list(self._uploads.values()):
            task.cancel()
        for consumer in self._consumers:
            await consumer.stop()

    def cancel(self, sandbox_id: str) -> None:
        """The sandbox is being resumed or killed: its capture is moot (and the VM is about
        to write the RAM file the upload reads)."""
        task = self._uploads.get(sandbox_id)
        if task is not None:
            task.cancel()

    async def handle(self, d: EventDelivery) -> None:
        match d.record.event:
            case sb.SandboxPaused(snapshot_id=str(snapshot_id)) as paused:
                await self._paused(d, paused.sandbox_id, snapshot_id)
            case sb.SnapshotTaken(node_id=node) as taken if node == self.node_id:
                await self._template(d, taken.snapshot_id)
            case tp.TemplateImported(node_id=node) as imported if node == self.node_id:
                await self._template(d, imported.template_id)
            case _:
                return  # not ours to upload: ack

    async def _paused(self, d: EventDelivery, sandbox_id: str, snapshot_id: str) -> None:
        # whose it is first: every node's worker sees every pause, and one of another node
        # was held back (and delivered twice) by the delay meant for our own
        capture = await self.captures.paused_capture(sandbox_id, snapshot_id)
        if capture is None:
            self.backlog.settled(sandbox_id)
            return  # not on this node, or moot: resumed or killed meanwhile
        if (wait := self.pause_delay_s - d.age_s) > 0:
            raise RetryableError("pause too recent to upload", delay_s=wait)
        failpoint("upload.before_put")
        if not await self._upload(sandbox_id, capture):
            return
        done = sb.RecordUpload(
            sandbox_id=sandbox_id, snapshot_id=capture.snapshot_id, size_bytes=capture.size_bytes
        )
        failpoint("upload.before_record")
        await execute(self.bus.sandboxes, done, MessageContext.caused_by_event(d.record))
        failpoint("upload.after_record")

    async def _template(self, d: EventDelivery, name: str) -> None:
        capture = self.captures.template_capture(name)
        if capture is None:
            self.backlog.settled(f"template:{name}")
            return  # deleted meanwhile
        if not await self._upload(f"template:{name}", capture):
            return
        source = self.captures.template_uploaded(name, capture.snapshot_id)
        if source is None:
            return  # a newer capture took the name while this one was uploading
        uploaded = tp.RecordTemplateUpload(
            template_id=name,
            key=capture.snapshot_id,
            source_sandbox_id=source.sandbox_id,
            capture_bytes=capture.size_bytes,
            image_bytes=capture.image_bytes,
        )
        await execute(self.bus.templates, uploaded, MessageContext.caused_by_event(d.record))

    async def _upload(self, key: str, capture: LocalCapture) -> bool:
        """Upload under the capture's own id (content-addressed: blobs already stored are
        not sent again); False when `cancel` made it moot."""
        task = asyncio.create_task(self._store(capture), name=f"upload:{key}")
        self._uploads[key] = task
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or not current.cancelling()):
                log.info("upload of %s cancelled: %s resumed or went", capture.snapshot_id, key)
                self.backlog.settled(key)
                return False
            raise
        except Exception as e:
            # Redelivered with backoff (the consumer naks it): say so on every failure, with
            # the whole backlog — a pause's durability is what is at stake.
            self.backlog.failed(key, time.monotonic())
            log.warning(
                "upload of %s (%s) failed, will retry: %s; %s",
                capture.snapshot_id,
                key,
                e,
                describe_uploads(*self.waiting()),
            )
            raise
        finally:
            if self._uploads.get(key) is task:
                del self._uploads[key]
        self.backlog.settled(key)
        return True

    async def _store(self, capture: LocalCapture) -> None:
        for slot, volume_id, image in capture.volumes:  # before the capture: it is durable
            sent = await self.repository.upload_volume(  # only once they are
                image, key=f"{capture.snapshot_id}-v{slot}", volume_id=volume_id
            )
            log.info("uploaded volume %s of %s: %s", volume_id, capture.snapshot_id, _sent(sent))
        result = await self.repository.upload(
            capture.dir,
            base_image_digest=capture.base_image_digest,
            snapshot_id=capture.snapshot_id,
        )
        log.info("uploaded %s: %s", capture.snapshot_id, _sent(result))


def _sent(result: object) -> str:
    """What an upload moved, in one short line (the repository's `UploadResult` holds the
    whole manifest: hundreds of chunk digests per log line otherwise)."""
    blobs, sent = getattr(result, "blobs_uploaded", None), getattr(result, "bytes_uploaded", None)
    if not isinstance(blobs, int) or not isinstance(sent, int):
        return str(result)
    reused = getattr(result, "blobs_reused", 0)
    return f"{blobs} blobs, {sent / 2**20:.1f} MiB sent, {reused} reused"
