"""Idempotent creation of aenv's streams and KV buckets, run by every process at start.

Limits (`BusSettings.event_max_*`, `command_max_msgs`): the event log keeps
`discard=new` — at a limit it refuses appends, loudly, and never drops history — and is
unlimited by default: JetStream reserves a stream's byte limit from its store when the
stream is made, so a default size would either fail on a small store or mean nothing on
a large one. What protects the log is seeing it fill: every API exports each stream's
bytes and messages against its limits, or against the servers' store when unlimited
(`shared.stream_metrics`, NATS's exporter), and the alert rules fire at 70 %
(deploy/prometheus/aenv-alerts.yml). The command queue is capped in messages (no
reservation) and refuses new commands when full, so a stalled queue cannot eat the
store the log needs.
"""

from __future__ import annotations

import contextlib

from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, BucketNotFoundError, NotFoundError

from bus.errors import BusError, ReplicasMismatch
from bus.settings import BusSettings
from bus.subjects import Names

__all__ = [
    "bucket_configs",
    "delete_all",
    "ensure_streams",
    "replicas_problem",
    "stream_configs",
]


def stream_configs(settings: BusSettings) -> list[StreamConfig]:
    """The desired configuration of both streams."""
    names = Names(settings.bus_prefix)
    return [
        StreamConfig(
            name=names.event_stream,
            description="aenv event log: the source of truth (one subject per aggregate)",
            subjects=[names.all_events],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            num_replicas=settings.replicas,
            duplicate_window=settings.duplicate_window_s,
            # Direct get serves aggregate loads without creating a consumer per load.
            allow_direct=True,
            # Never drop history to make room: refuse writes instead, loudly.
            discard=DiscardPolicy.NEW,
            deny_delete=True,
            max_bytes=_limit(settings.event_max_bytes),
            max_msgs=_limit(settings.event_max_msgs),
        ),
        StreamConfig(
            name=names.command_stream,
            description="aenv commands: work queue, removed once a worker acks",
            subjects=[names.all_commands],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            num_replicas=settings.replicas,
            duplicate_window=settings.duplicate_window_s,
            # full: refuse new commands (the caller hears it); `old` would drop queued ones
            discard=DiscardPolicy.NEW,
            max_msgs=_limit(settings.command_max_msgs),
        ),
    ]


def _limit(value: int) -> int:
    """A setting's limit as JetStream's (0 in our settings, -1 in JetStream: none)."""
    return value if value > 0 else -1


def bucket_configs(settings: BusSettings) -> list[KeyValueConfig]:
    """The KV buckets: live facts about nodes and VMs (state, not history)."""
    names = Names(settings.bus_prefix)
    return [
        KeyValueConfig(
            bucket=names.nodes_bucket,
            description="node heartbeats and free capacity",
            history=1,
            ttl=settings.node_ttl_s,
            # file: a memory bucket vanished with a NATS restart, and every heartbeat after
            # it failed ("stream not found"): the API then took every node for gone
            storage=StorageType.FILE,
            replicas=settings.replicas,
        ),
        KeyValueConfig(
            bucket=names.routes_bucket,
            description="running sandbox -> node and guest address (the proxy's map)",
            history=1,
            # file: an API restarted while NATS stays up must still find every VM
            storage=StorageType.FILE,
            replicas=settings.replicas,
        ),
        KeyValueConfig(
            bucket=names.secrets_bucket,
            description="short-lived secrets for workers (registry credentials of a build)",
            history=1,
            ttl=settings.secret_ttl_s,
            # memory: a secret never touches the servers' disks; a restart loses it, and
            # the build that needed it fails saying so
            storage=StorageType.MEMORY,
            replicas=settings.replicas,
        ),
    ]


def replicas_problem(stream: str, existing: int, wanted: int) -> str | None:
    """Why a role must not start against a stream of `existing` replicas when its own
    `AENV_REPLICAS` says `wanted`; None when they agree.

    Every role start updates the streams to its own config, so a single env file without
    `AENV_REPLICAS` (default 1) once took the fleet's event log from R3 to R1. A start
    never changes replicas, in either direction: lowering gives up copies of the only
    source of truth, and raising from one node would make every other node's (still
    correct) env file the mismatch at its next restart. Changing them is the operator's
    explicit act on the stream itself, then on every env file.
    """
    if existing == wanted:
        return None
    return (
        f"stream {stream} has {existing} replicas, this role asks for {wanted}: "
        f"set AENV_REPLICAS={existing} (changing replicas is an operator's explicit act, "
        f"never a role start's: `nats stream edit {stream} --replicas {wanted}` and the "
        f"same for every aenv stream and KV bucket, then AENV_REPLICAS={wanted} in every "
        f"role's environment; docs/settings.md)"
    )


async def ensure_streams(js: JetStreamContext, settings: BusSettings) -> None:
    """Create the streams (or update them to the desired config) and the KV buckets.

    An existing stream whose replicas differ from `settings.replicas` is left as it is and
    `ReplicasMismatch` raised (`replicas_problem`): the role refuses to start.
    """
    try:
        for config in stream_configs(settings):
            try:
                info = await js.stream_info(config.name or "")
            except NotFoundError:
                await js.add_stream(config)
                continue
            existing = info.config.num_replicas or 1
            if problem := replicas_problem(config.name or "", existing, settings.replicas):
                raise ReplicasMismatch(problem)
            await js.update_stream(config)
        for bucket in bucket_configs(settings):
            try:
                kv = await js.key_value(bucket.bucket)
            except BucketNotFoundError:
                await js.create_key_value(bucket)
                continue
            info = (await kv.status()).stream_info
            if info.config.storage != bucket.storage:  # JetStream cannot change it in place
                await js.delete_key_value(bucket.bucket)  # live facts only: rebuilt at once
                await js.create_key_value(bucket)
    except APIError as e:
        raise BusError(f"cannot set up streams: {e}") from e


async def delete_all(js: JetStreamContext, settings: BusSettings) -> None:
    """Remove both streams and the bucket of a (test) namespace. Refuses the empty prefix."""
    if not settings.bus_prefix:
        raise BusError("refusing to delete the streams of the unprefixed (production) stack")
    names = Names(settings.bus_prefix)
    for stream in (names.event_stream, names.command_stream):
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(stream)
    for bucket in (
        names.nodes_bucket,
        names.routes_bucket,
        names.secrets_bucket,
        names.gc_lease_bucket,
    ):
        with contextlib.suppress(NotFoundError, BucketNotFoundError):
            await js.delete_key_value(bucket)
