"""Build keys (`domain/buildkey.py`, issue 43): identical builds of one template share one
build; one row per key says which build leads its current generation, which builds joined
it, and how it ended.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-08

Locking: a new table only (no lock on anything in use). Logs from before have no build key
events: the table starts empty, which is what they fold to.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "build_keys",
        sa.Column("key_id", sa.Text, primary_key=True),
        sa.Column("template_id", sa.Text, nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("leader_build_id", sa.Text, nullable=False),
        sa.Column("followers", JSONB, nullable=False),  # [build id] that joined it
        sa.Column("status", sa.Text, nullable=False),  # building | ready | error
        sa.Column("capture_id", sa.Text),
        sa.Column("reason", sa.Text),
        sa.Column("failed_step", sa.Text),
        sa.Column("settled_at", sa.DateTime(timezone=True)),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("build_keys")
