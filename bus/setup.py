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

A role start never changes the limits of an existing stream, as it never changes its
replicas: one env file with other values would change them fleet-wide. A mismatch refuses
to start, naming both values (`LimitsMismatch`, `limits_problem`); `aenv log limits set`
(`set_limits`) is the operator's explicit act that changes them. A stream aenv has not set
limits on yet (made by a version before them: no `LIMITS_SET` in its description) takes
the first starting role's, once.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, BucketNotFoundError, NotFoundError

from bus.errors import BusError, LimitsMismatch, ReplicasMismatch
from bus.settings import BusSettings
from bus.subjects import Names

__all__ = [
    "LIMITS_SET",
    "StreamLimit",
    "bucket_configs",
    "delete_all",
    "ensure_streams",
    "limits_of",
    "limits_problem",
    "limits_set",
    "replicas_problem",
    "set_limits",
    "stream_configs",
    "stream_limits",
]

#: What a stream's description ends with once its limits are aenv's (set by a role start
#: or by `aenv log limits set`): from then on a role start that disagrees refuses to start.
#: In the description, not the metadata: servers before NATS 2.10 drop stream metadata.
LIMITS_SET = "[limits set by aenv: aenv log limits set]"


@dataclass(frozen=True)
class StreamLimit:
    """One limit of one stream: its `StreamConfig` field, the setting that gives it, and
    the option of `aenv log limits set` that changes it."""

    field: str
    env: str
    option: str


def stream_limits(names: Names) -> dict[str, tuple[StreamLimit, ...]]:
    """The limits aenv sets, by stream."""
    return {
        names.event_stream: (
            StreamLimit("max_bytes", "AENV_EVENT_MAX_BYTES", "--event-max-bytes"),
            StreamLimit("max_msgs", "AENV_EVENT_MAX_MSGS", "--event-max-msgs"),
        ),
        names.command_stream: (
            StreamLimit("max_msgs", "AENV_COMMAND_MAX_MSGS", "--command-max-msgs"),
        ),
    }


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
        KeyValueConfig(
            bucket=names.admission_bucket,
            description="creation-rate token buckets of the teams (admission control)",
            history=1,
            # an idle bucket refills within burst/rate seconds: an hour-old entry is full
            ttl=3600,
            # memory: a NATS restart refills every bucket, which only forgives a second
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


def limits_of(config: StreamConfig, limits: tuple[StreamLimit, ...]) -> dict[str, int]:
    """A stream's limits as our settings say them (0: none), by setting name."""
    return {lim.env: max(0, getattr(config, lim.field) or 0) for lim in limits}


def limits_problem(
    stream: str, existing: StreamConfig, wanted: StreamConfig, limits: tuple[StreamLimit, ...]
) -> str | None:
    """Why a role must not start against a stream whose limits (`existing`) differ from
    those its own settings give (`wanted`); None when they agree. Like replicas, limits
    are the fleet's: one env file must not change them for every role."""
    have, want = limits_of(existing, limits), limits_of(wanted, limits)
    if have == want:
        return None

    def say(values: dict[str, int]) -> str:
        return " ".join(f"{k}={v}" for k, v in values.items())

    options = " ".join(f"{lim.option} {want[lim.env]}" for lim in limits)
    return (
        f"stream {stream} has limits {say(have)}, this role asks for {say(want)} (0: none): "
        f"set {say(have)} (changing a stream's limits is an operator's explicit act, never "
        f"a role start's: `aenv log limits set {options}`, then the same values in every "
        f"role's environment; docs/deploy.md)"
    )


def limits_set(config: StreamConfig) -> bool:
    """Whether aenv set this stream's limits (`LIMITS_SET`)."""
    return (config.description or "").endswith(LIMITS_SET)


def _marked(config: StreamConfig) -> StreamConfig:
    """`config` with the description saying its limits are aenv's."""
    if limits_set(config):
        return config
    return replace(config, description=f"{config.description or ''} {LIMITS_SET}".lstrip())


async def ensure_streams(js: JetStreamContext, settings: BusSettings) -> None:
    """Create the streams (or update them to the desired config) and the KV buckets.

    An existing stream whose replicas differ from `settings.replicas` is left as it is and
    `ReplicasMismatch` raised (`replicas_problem`): the role refuses to start. So is one
    whose limits aenv set differing from the settings' (`LimitsMismatch`).
    """
    limits = stream_limits(Names(settings.bus_prefix))
    try:
        for config in map(_marked, stream_configs(settings)):
            name = config.name or ""
            try:
                info = await js.stream_info(name)
            except NotFoundError:
                await js.add_stream(config)
                continue
            existing = info.config.num_replicas or 1
            if problem := replicas_problem(name, existing, settings.replicas):
                raise ReplicasMismatch(problem)
            if limits_set(info.config) and (
                problem := limits_problem(name, info.config, config, limits[name])
            ):
                raise LimitsMismatch(problem)
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


async def set_limits(
    js: JetStreamContext, settings: BusSettings, values: dict[str, int]
) -> dict[str, dict[str, int]]:
    """The operator's change of the streams' limits (`aenv log limits set`): `values` by
    setting name (`AENV_EVENT_MAX_BYTES`…; 0: none), those not given kept as they are.
    Returns every stream's limits after. JetStream refuses a byte limit its store cannot
    reserve (a `BusError`). Every role's environment must then say the same."""
    limits = stream_limits(Names(settings.bus_prefix))
    known = {lim.env for lims in limits.values() for lim in lims}
    if unknown := set(values) - known:
        raise BusError(f"not a stream limit: {sorted(unknown)} (known: {sorted(known)})")
    after: dict[str, dict[str, int]] = {}
    try:
        for stream, lims in limits.items():
            config = (await js.stream_info(stream)).config
            given: dict[str, Any] = {
                lim.field: _limit(values[lim.env]) for lim in lims if lim.env in values
            }
            config = _marked(replace(config, **given))
            await js.update_stream(config)
            after[stream] = limits_of(config, lims)
    except NotFoundError as e:
        raise BusError(f"no stream to set limits on (start a role first): {e}") from e
    except APIError as e:
        raise BusError(f"cannot set the streams' limits: {e}") from e
    return after


async def _stream_names(js: JetStreamContext) -> list[str]:
    """Every stream's name on the server (the list comes in pages)."""
    out: list[str] = []
    while page := await js.streams_info(offset=len(out)):
        out += [i.config.name or "" for i in page]
    return out


async def delete_all(js: JetStreamContext, settings: BusSettings) -> None:
    """Remove the streams (the log, the commands, the pipelines' feed and team streams) and
    the buckets of a (test) namespace. Refuses the empty prefix."""
    if not settings.bus_prefix:
        raise BusError("refusing to delete the streams of the unprefixed (production) stack")
    names = Names(settings.bus_prefix)
    teams = names.team_stream("x")[:-1]  # the teams' streams (pipelines) share this start
    streams = [names.event_stream, names.command_stream, names.feed_stream]
    streams += [n for n in await _stream_names(js) if n.startswith(teams)]
    for stream in streams:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(stream)
    for bucket in (
        names.nodes_bucket,
        names.routes_bucket,
        names.secrets_bucket,
        names.gc_lease_bucket,
        names.admission_bucket,
    ):
        with contextlib.suppress(NotFoundError, BucketNotFoundError):
            await js.delete_key_value(bucket)
