"""Template builds and their logs.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

Locking: creates two new tables and an index on one of them (empty); no existing object is
touched, so nothing running is blocked.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "template_builds",
        sa.Column("build_id", sa.Text, primary_key=True),
        sa.Column("template_id", sa.Text, nullable=False),
        sa.Column("alias", sa.Text),
        sa.Column("team_id", sa.Text),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("cpu_count", sa.Integer, nullable=False),
        sa.Column("memory_mb", sa.Integer, nullable=False),
        sa.Column("disk_size_mb", sa.Integer, nullable=False),
        sa.Column("spec", JSONB),
        sa.Column("node_id", sa.Text),
        sa.Column("reason", sa.Text),
        sa.Column("failed_step", sa.Text),
        sa.Column("sandbox_id", sa.Text),
        sa.Column("envd_version", sa.Text),
        sa.Column("log_count", sa.Integer, nullable=False),
        sa.Column("requested_at", TZ, nullable=False),
        sa.Column("started_at", TZ),
        sa.Column("finished_at", TZ),
        sa.Column("updated_at", TZ, nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
    )
    op.create_index(
        "ix_template_builds_template", "template_builds", ["template_id", "requested_at"]
    )
    op.create_table(
        "template_build_logs",
        sa.Column("build_id", sa.Text, primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("at", TZ, nullable=False),
        sa.Column("level", sa.Text, nullable=False),
        sa.Column("step", sa.Text),
        sa.Column("message", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("template_build_logs")
    op.drop_index("ix_template_builds_template", table_name="template_builds")
    op.drop_table("template_builds")
