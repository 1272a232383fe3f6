"""Volumes (E2B's persistent volumes, `domain/volume.py`): one row per volume, and the
volumes a sandbox mounts (`volumeMounts` of E2B's SandboxDetail and ListedSandbox).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04

`volumes` mirrors the volume aggregate's state: its team and name (E2B lists a team's
volumes; a name is unique per team because the id derives from both), who holds it now and
on which node, and its latest durable version (the repository key of its image, its size,
the node that keeps a copy). The API reads one volume from the log itself (its token must
be checked against the latest state); listings read here.

Locking: a new table (no lock on anything in use) and ADD COLUMN with a constant default on
`sandboxes` (Postgres 11+: no table rewrite; ACCESS EXCLUSIVE for a moment). Rows of
sandboxes from before get `[]`, which is what their log folds to.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "volumes",
        sa.Column("volume_id", sa.Text, primary_key=True),
        sa.Column("team_id", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("token_sha256", sa.Text, nullable=False),
        sa.Column("incarnation", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),  # available | attached | destroyed
        sa.Column("holder", sa.Text),
        sa.Column("holder_node", sa.Text),
        sa.Column("version_key", sa.Text),
        sa.Column("version_size", sa.BigInteger),
        sa.Column("version_node", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attached_at", sa.DateTime(timezone=True)),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_volumes_team_name", "volumes", ["team_id", "name"])
    op.add_column(
        "sandboxes",
        sa.Column("volume_mounts", JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
    )


def downgrade() -> None:
    op.drop_column("sandboxes", "volume_mounts")
    op.drop_index("ix_volumes_team_name", table_name="volumes")
    op.drop_table("volumes")
