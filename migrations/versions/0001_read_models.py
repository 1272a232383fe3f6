"""Read models: sandboxes, snapshots, templates, api_keys, checkpoints, nodes view.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Locking: creates new tables, indexes and a view only; it touches no existing object, so it
takes no lock that could block a running system (CREATE INDEX is not CONCURRENTLY, which is
fine on empty tables). Later revisions that index big tables must use
`op.create_index(..., postgresql_concurrently=True)` inside `op.get_context().autocommit_block()`.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)


def _position() -> list[sa.Column[object]]:
    return [
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "sandboxes",
        sa.Column("sandbox_id", sa.Text, primary_key=True),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("state", sa.Text),
        sa.Column("template_id", sa.Text, nullable=False),
        sa.Column("alias", sa.Text),
        sa.Column("team_id", sa.Text),
        sa.Column("api_key_id", sa.Text),
        sa.Column("node_id", sa.Text),
        sa.Column("forked_from", sa.Text),
        sa.Column("cpu_count", sa.Integer, nullable=False),
        sa.Column("memory_mb", sa.Integer, nullable=False),
        sa.Column("disk_size_mb", sa.Integer, nullable=False),
        sa.Column("envd_version", sa.Text, nullable=False),
        sa.Column("envd_access_token", sa.Text),
        sa.Column("metadata", JSONB, nullable=False),
        sa.Column("env_vars", JSONB, nullable=False),
        sa.Column("on_timeout", sa.Text, nullable=False),
        sa.Column("auto_resume", sa.Boolean, nullable=False),
        sa.Column("allow_internet_access", sa.Boolean, nullable=False),
        sa.Column("network", JSONB, nullable=False),
        sa.Column("timeout_s", sa.Integer, nullable=False),
        sa.Column("requested_at", TZ, nullable=False),
        sa.Column("started_at", TZ),
        sa.Column("end_at", TZ),
        sa.Column("remaining_s", sa.Float),
        sa.Column("failure_reason", sa.Text),
        sa.Column("pending_children", JSONB, nullable=False),
        sa.Column("pending_snapshot_id", sa.Text),
        sa.Column("updated_at", TZ, nullable=False),
        *_position(),
    )
    op.create_index(
        "ix_sandboxes_team_state_started", "sandboxes", ["team_id", "state", "started_at"]
    )
    op.create_index("ix_sandboxes_node", "sandboxes", ["node_id"])
    op.create_index("ix_sandboxes_metadata", "sandboxes", ["metadata"], postgresql_using="gin")

    op.create_table(
        "snapshots",
        sa.Column("snapshot_id", sa.Text, primary_key=True),
        sa.Column("sandbox_id", sa.Text, nullable=False),
        sa.Column("team_id", sa.Text),
        sa.Column("template_id", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("size_bytes", sa.BigInteger),
        sa.Column("failure_reason", sa.Text),
        sa.Column("requested_at", TZ, nullable=False),
        sa.Column("taken_at", TZ),
        *_position(),
    )
    op.create_index("ix_snapshots_sandbox", "snapshots", ["sandbox_id"])
    op.create_index("ix_snapshots_team", "snapshots", ["team_id"])

    op.create_table(
        "templates",
        sa.Column("template_id", sa.Text, primary_key=True),
        sa.Column("alias", sa.Text),
        sa.Column("envd_version", sa.Text, nullable=False),
        sa.Column("cpu_count", sa.Integer, nullable=False),
        sa.Column("memory_mb", sa.Integer, nullable=False),
        sa.Column("disk_size_mb", sa.Integer, nullable=False),
        sa.Column("deleted", sa.Boolean, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
        *_position(),
    )
    op.create_index("ix_templates_alias", "templates", ["alias"])

    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.Text, primary_key=True),
        sa.Column("team_id", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("prefix", sa.Text, nullable=False),
        sa.Column("key_sha256", sa.Text, nullable=False, unique=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("revoked_at", TZ),
        *_position(),
    )
    op.create_index("ix_api_keys_team", "api_keys", ["team_id"])

    op.create_table(
        "projection_checkpoints",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
    )

    # Capacity in use per node, for placement decisions and operators. A view, so it can
    # never disagree with `sandboxes` (and needs no projection or rebuild of its own).
    op.execute(
        """
        CREATE VIEW nodes AS
        SELECT node_id,
               count(*)::int                                          AS sandboxes,
               count(*) FILTER (WHERE state = 'running')::int         AS running,
               count(*) FILTER (WHERE state = 'paused')::int          AS paused,
               coalesce(sum(cpu_count) FILTER (WHERE state = 'running'), 0)::int AS cpu_count,
               coalesce(sum(memory_mb) FILTER (WHERE state = 'running'), 0)::bigint
                                                                      AS memory_mb
        FROM sandboxes
        WHERE node_id IS NOT NULL AND status NOT IN ('killed', 'failed')
        GROUP BY node_id
        """
    )


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS nodes")
    for table in ("projection_checkpoints", "api_keys", "templates", "snapshots", "sandboxes"):
        op.drop_table(table)
