"""The releaser: when a sandbox that holds volumes on this node ends, what it left in them
becomes their next durable version, and they are free again.

A durable consumer of the sandbox events per node (`volumes-<node>`), like the snapshot
worker's: a `SandboxKilled` (or the `SandboxFailed` of a create whose VM never ran) is
acked only once every volume the sandbox held here is uploaded (changed chunks only) and
released in the log (`ReleaseVolume` with the version's key). Until then the volume stays
attached to the ended sandbox — "releasing": a create that mounts it waits, the API
answers 409 after a while. A node killed mid-upload finds the event again after its
restart (the log is the to-do list) and redoes the upload under the same key.

Which volumes: the log's (the sandbox's mounts, each still held by it from this node)
together with this node's images held by it — an image whose volume the log has given to
someone else since is stale and goes; a volume the log says it holds with no image here
(its create failed before the image was made) is released unchanged.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from bus import Bus, ConsumerSpec, MessageContext
from bus.decisions import execute
from bus.event_consumer import EventConsumer, EventDelivery
from bus.subjects import AggregateKind
from domain import sandbox as sb
from domain import volume as vo
from workers.node.ports import Host
from workers.node.volumes.images import version_key

__all__ = ["RELEASE_ATTEMPTS", "VolumeReleaser", "release_held"]

log = logging.getLogger(__name__)

#: Redelivery after a failed upload (S3 down): 2 s, 6 s, … capped at 5 minutes.
RELEASE_BACKOFF = (2.0, 6.0, 18.0, 54.0, 162.0, 300.0)
#: "Until durable" in practice: a month of 5-minute retries.
RELEASE_ATTEMPTS = 10_000
#: A consumer created now starts this far back in the log (an upgrade or a new node id
#: finds the ends whose release never finished).
START_BACK = timedelta(hours=1)


async def release_held(
    bus: Bus,
    host: Host,
    node_id: str,
    holder: str,
    mounts: tuple[sb.VolumeMount, ...],
    context: MessageContext,
) -> int:
    """Release every volume `holder` has on this node (uploading what it left first);
    how many were released. Safe to repeat: a release decided already decides nothing."""
    volumes = host.volumes
    ids = list(dict.fromkeys([*(m.volume_id for m in mounts), *volumes.held_by(holder)]))
    done = 0
    for vid in ids:
        state, _ = await bus.volumes.load(vid)
        ours = (
            state is not None
            and not state.destroyed
            and state.holder == holder
            and state.holder_node in (None, node_id)
        )
        async with volumes.lock(vid):
            if not ours:
                if vid in volumes.held_by(holder):
                    mine = (
                        state is not None
                        and state.version is not None
                        and (state.version.key == version_key(vid, holder))
                    )
                    if mine:  # released by an earlier delivery that died before noting it
                        volumes.released(vid, version_key(vid, holder))
                    else:
                        log.info(
                            "volume %s: %s no longer holds it; dropping its image here", vid, holder
                        )
                        volumes.forget_holder(vid)
                continue
            uploaded = await volumes.upload(vid, holder) if vid in volumes.held_by(holder) else None
            version = None
            if uploaded is not None:
                version = vo.VolumeVersion(key=uploaded[0], size_bytes=uploaded[1], node_id=node_id)
            release = vo.ReleaseVolume(
                volume_id=vid,
                holder=holder,
                node_id=node_id,
                version=version,
                command_id=sb.derived_command_id(holder, "release", vid),
            )
            after, _, events = await execute(bus.volumes, release, context)
            recorded = after.version.key if after is not None and after.version else None
            if version is not None and recorded == version.key:
                volumes.released(vid, version.key)  # (also a redelivery: the same key)
            elif uploaded is not None:  # released otherwise meanwhile: the image is no version
                volumes.forget_holder(vid)
            if events:
                done += 1
                log.info(
                    "volume %s released by %s: %s",
                    vid,
                    holder,
                    version.key if version else "unchanged",
                )
    return done


class VolumeReleaser:
    def __init__(self, bus: Bus, host: Host, node_id: str) -> None:
        self.bus = bus
        self.host = host
        self.node_id = node_id
        self._consumer: EventConsumer | None = None

    def spec(self) -> ConsumerSpec:
        names = self.bus.names
        return ConsumerSpec(
            durable=names.volume_consumer(self.node_id),
            filter_subject=names.events_of_kind(AggregateKind.SANDBOX),
            max_deliver=RELEASE_ATTEMPTS,
            backoff=RELEASE_BACKOFF,
            max_ack_pending=8,
            start_time=datetime.now(UTC) - START_BACK,
        )

    async def start(self) -> None:
        self._consumer = EventConsumer(self.bus.js, self.bus.settings, self.spec(), self.handle)
        await self._consumer.start()

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    async def handle(self, d: EventDelivery) -> None:
        event = d.record.event
        if not isinstance(event, sb.SandboxKilled | sb.SandboxFailed):
            return
        sid = event.sandbox_id
        if self.host.runs(sid) or self.host.holds_paused(sid):
            return  # a failed operation left its VM here: its kill releases the volumes
        held = self.host.volumes.held_by(sid)
        state, _ = await self.bus.sandboxes.load(sid)
        mounts = state.volume_mounts if state is not None else ()
        if not held and not (mounts and state is not None and state.node_id == self.node_id):
            return  # not ours: another node's sandbox, or one without volumes
        await release_held(
            self.bus, self.host, self.node_id, sid, mounts, MessageContext.caused_by_event(d.record)
        )
