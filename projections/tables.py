"""The read models' tables (SQLAlchemy Core). The schema itself is owned by the Alembic
revisions in `migrations/`; `tests/integration/projections` checks the two agree.

Every projected row carries `revision` (the aggregate version of the last event folded into
it) and `last_seq` (that event's stream sequence): upserts are guarded by
`stored.revision < new.revision`, so replaying an event can never move a row backwards.
Timestamps all come from events (never `now()`), which is what makes a rebuild reproduce the
live tables exactly.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    false,
    text,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB

__all__ = [
    "api_keys",
    "build_keys",
    "build_logs",
    "builds",
    "images",
    "leases",
    "metadata",
    "node_cordons",
    "nodes",
    "projection_checkpoints",
    "sandboxes",
    "snapshots",
    "template_spawns",
    "templates",
    "volumes",
]

metadata = MetaData()


def _tz(name: str, nullable: bool = True) -> Column[object]:
    return Column(name, DateTime(timezone=True), nullable=nullable)


def _position() -> list[Column[object]]:
    return [
        Column("revision", Integer, nullable=False),
        Column("last_seq", BigInteger, nullable=False),
    ]


sandboxes = Table(
    "sandboxes",
    metadata,
    Column("sandbox_id", Text, primary_key=True),
    Column("status", Text, nullable=False),  # SandboxStatus: creating … killed, failed
    Column("state", Text),  # E2B's view: running | paused | NULL (not listed)
    Column("template_id", Text, nullable=False),
    Column("alias", Text),
    Column("team_id", Text),
    Column("api_key_id", Text),
    Column("node_id", Text),
    Column("forked_from", Text),
    Column("cpu_count", Integer, nullable=False),
    Column("memory_mb", Integer, nullable=False),
    Column("disk_size_mb", Integer, nullable=False),
    Column("envd_version", Text, nullable=False),
    Column("envd_access_token", Text),
    Column("traffic_access_token", Text),  # allowPublicTraffic=false only (0006)
    Column("metadata", JSONB, nullable=False),
    Column("env_vars", JSONB, nullable=False),
    Column("on_timeout", Text, nullable=False),  # kill | pause
    Column("auto_resume", Boolean, nullable=False),
    Column("pause_memory", Boolean, nullable=False, server_default=true()),  # 0008
    Column("allow_internet_access", Boolean, nullable=False),
    Column("network", JSONB, nullable=False),
    Column("timeout_s", Integer, nullable=False),
    _tz("requested_at", nullable=False),
    _tz("started_at"),
    _tz("end_at"),
    Column("remaining_s", Float),
    _tz("paused_at"),  # paused sandboxes are kept AENV_PAUSED_RETENTION_S (0008)
    _tz("disk_full_at"),  # when its guest last filled its root disk (0016)
    Column("failure_reason", Text),
    Column("pending_children", JSONB, nullable=False),
    Column("pending_snapshot_id", Text),
    # the volumes it mounts: [{name, path, volume_id}] (0010)
    Column("volume_mounts", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    _tz("updated_at", nullable=False),
    *_position(),
)

snapshots = Table(
    "snapshots",
    metadata,
    Column("snapshot_id", Text, primary_key=True),
    Column("sandbox_id", Text, nullable=False),
    Column("team_id", Text),
    Column("template_id", Text, nullable=False),
    Column("status", Text, nullable=False),  # requested | ready | failed
    Column("size_bytes", BigInteger),
    Column("failure_reason", Text),
    Column("node_id", Text),  # where the capture lives (0004)
    _tz("requested_at", nullable=False),
    _tz("taken_at"),
    *_position(),
)

#: Creates of sandboxes per template (E2B's `spawnCount`, `lastSpawnedAt`), counted by the
#: sandboxes projection from `SandboxCreated` (0011). `last_seq`: the stream sequence of the
#: last create counted, so a replayed one is never counted twice.
template_spawns = Table(
    "template_spawns",
    metadata,
    Column("template_id", Text, primary_key=True),
    Column("spawn_count", BigInteger, nullable=False),
    _tz("last_spawned_at", nullable=False),
    Column("last_seq", BigInteger, nullable=False),
)

templates = Table(
    "templates",
    metadata,
    Column("template_id", Text, primary_key=True),
    Column("alias", Text),
    Column("envd_version", Text, nullable=False),
    Column("cpu_count", Integer, nullable=False),
    Column("memory_mb", Integer, nullable=False),
    Column("disk_size_mb", Integer, nullable=False),
    Column("deleted", Boolean, nullable=False),
    Column("capture_key", Text),  # a snapshot template's capture in the repository (0005)
    Column("capture_of", Text),  # the sandbox it was taken of (0005)
    # what a node without it stores to create from it: capture, image and runtime (0015)
    Column("capture_bytes", BigInteger),
    Column("image_bytes", BigInteger),
    # a built template's tags: {tag: {build_id, capture_id, at}} (0009)
    Column("tags", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # captures no tag names any more, waiting to be dropped: {capture_id: since} (0009)
    Column("released", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    _tz("created_at", nullable=False),
    _tz("updated_at", nullable=False),
    *_position(),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", Text, primary_key=True),
    Column("team_id", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("prefix", Text, nullable=False),  # first characters, for display only
    Column("key_sha256", Text, nullable=False, unique=True),
    _tz("created_at", nullable=False),
    _tz("revoked_at"),
    # the key's admission overrides (`domain.limits.Limits`, fields it does not set left out)
    Column("limits", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    *_position(),
)

#: One row per template build (`domain.build`): status, reason, spec, log length.
builds = Table(
    "template_builds",
    metadata,
    Column("build_id", Text, primary_key=True),
    Column("template_id", Text, nullable=False),
    Column("alias", Text),
    Column("team_id", Text),
    Column("status", Text, nullable=False),  # waiting | building | ready | error
    Column("cpu_count", Integer, nullable=False),
    Column("memory_mb", Integer, nullable=False),
    Column("disk_size_mb", Integer, nullable=False),
    Column("spec", JSONB),
    Column("node_id", Text),
    Column("reason", Text),
    Column("failed_step", Text),
    Column("sandbox_id", Text),
    Column("envd_version", Text),
    Column("log_count", Integer, nullable=False),
    # its template was deleted before any build of it was published (0012): not listed
    Column("discarded", Boolean, nullable=False, server_default=false()),
    _tz("requested_at", nullable=False),
    _tz("started_at"),
    _tz("finished_at"),
    _tz("updated_at", nullable=False),
    *_position(),
)

#: A build's log, one row per entry (from `TemplateBuildLogged`; `idx` is the entry's
#: position in the build's log, the status route's `logsOffset`).
build_logs = Table(
    "template_build_logs",
    metadata,
    Column("build_id", Text, primary_key=True),
    Column("idx", Integer, primary_key=True),
    _tz("at", nullable=False),
    Column("level", Text, nullable=False),
    Column("step", Text),
    Column("message", Text, nullable=False),
)

#: One row per volume (`domain.volume`, migration 0010): a team's volumes by name, who
#: holds each, its latest durable version.
volumes = Table(
    "volumes",
    metadata,
    Column("volume_id", Text, primary_key=True),
    Column("team_id", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("token_sha256", Text, nullable=False),
    Column("incarnation", Text, nullable=False),
    Column("status", Text, nullable=False),  # available | attached | destroyed
    Column("holder", Text),
    Column("holder_node", Text),
    Column("version_key", Text),
    Column("version_size", BigInteger),
    Column("version_node", Text),
    _tz("created_at", nullable=False),
    _tz("attached_at"),
    _tz("updated_at", nullable=False),
    *_position(),
)

images = Table(
    "images",
    metadata,
    Column("image_id", Text, primary_key=True),
    Column("status", Text, nullable=False),  # empty | claimed | published | failed
    Column("claim_node", Text),
    _tz("claim_since"),
    _tz("claim_until"),
    Column("digest", Text),
    Column("stored_bytes", BigInteger),
    Column("size", BigInteger),
    Column("role", Text),
    Column("published_node", Text),
    _tz("published_at"),
    Column("failure_node", Text),
    Column("failure_reason", Text),
    _tz("failed_at"),
    _tz("updated_at", nullable=False),
    *_position(),
)

#: One row per build key (`domain.buildkey`, migration 0014): which build leads the identical
#: builds of a template and which joined it, and how the current generation ended.
build_keys = Table(
    "build_keys",
    metadata,
    Column("key_id", Text, primary_key=True),
    Column("template_id", Text, nullable=False),
    Column("generation", Integer, nullable=False),
    Column("leader_build_id", Text, nullable=False),
    Column("followers", JSONB, nullable=False),  # [build id] that joined this generation
    Column("status", Text, nullable=False),  # building | ready | error
    Column("capture_id", Text),
    Column("reason", Text),
    Column("failed_step", Text),
    _tz("settled_at"),
    _tz("updated_at", nullable=False),
    *_position(),
)

#: One row per node an operator addressed (`domain/node`, migration 0017): its cordon.
node_cordons = Table(
    "node_cordons",
    metadata,
    Column("node_id", Text, primary_key=True),
    Column("cordoned", Boolean, nullable=False),
    Column("reason", Text, nullable=False),
    _tz("cordoned_at"),
    _tz("updated_at", nullable=False),
    *_position(),
)

#: One row per lease (`domain/lease`, migration 0018): its team, deadline and status.
leases = Table(
    "leases",
    metadata,
    Column("lease_id", Text, primary_key=True),
    Column("team_id", Text, nullable=False),
    Column("ttl_s", Float, nullable=False),
    Column("on_expiry", Text, nullable=False),
    Column("status", Text, nullable=False),  # LeaseStatus: active | expired | ended
    _tz("opened_at", nullable=False),
    _tz("expires_at", nullable=False),
    _tz("ended_at"),
    _tz("updated_at", nullable=False),
    *_position(),
)

projection_checkpoints = Table(
    "projection_checkpoints",
    metadata,
    Column("name", Text, primary_key=True),
    # Last AENV_EVT stream sequence whose effect is committed in this projection's tables.
    Column("seq", BigInteger, nullable=False),
)

# The API's queries: list a team's sandboxes by state, newest first; a node's sandboxes;
# filter by metadata (containment, hence GIN).
Index(
    "ix_sandboxes_team_state_started",
    sandboxes.c.team_id,
    sandboxes.c.state,
    sandboxes.c.started_at,
)
Index("ix_sandboxes_node", sandboxes.c.node_id)
# Admission control's count of a team's sandboxes holding a VM (migration 0019).
Index(
    "ix_sandboxes_team_holding_vm",
    sandboxes.c.team_id,
    postgresql_where=sandboxes.c.status.in_(
        ("creating", "running", "pausing", "resuming", "snapshotting", "forking")
    ),
)
# The TTL timer's scan: running sandboxes past their end (migration 0002).
Index(
    "ix_sandboxes_running_end_at",
    sandboxes.c.end_at,
    postgresql_where=sandboxes.c.status == "running",
)
# The timer's start: the sandboxes not killed (migration 0007).
Index(
    "ix_sandboxes_not_killed",
    sandboxes.c.sandbox_id,
    postgresql_where=sandboxes.c.status != "killed",
)
Index("ix_sandboxes_metadata", sandboxes.c.metadata, postgresql_using="gin")
Index("ix_snapshots_sandbox", snapshots.c.sandbox_id)
Index("ix_snapshots_team", snapshots.c.team_id)
Index("ix_templates_alias", templates.c.alias)
Index("ix_api_keys_team", api_keys.c.team_id)
Index("ix_template_builds_template", builds.c.template_id, builds.c.requested_at)
Index("ix_volumes_team_name", volumes.c.team_id, volumes.c.name)
# The lease timer's scans: leases by status and deadline; a team's listing.
Index("ix_leases_status_expires", leases.c.status, leases.c.expires_at)
Index("ix_leases_team", leases.c.team_id)

#: A view (see the migration): live capacity used per node, derived from `sandboxes`.
nodes = Table(
    "nodes",
    metadata,
    Column("node_id", Text, primary_key=True),
    Column("sandboxes", Integer),
    Column("running", Integer),
    Column("paused", Integer),
    Column("cpu_count", Integer),
    Column("memory_mb", BigInteger),
    info={"is_view": True},
)
