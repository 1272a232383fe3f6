"""Leases (`domain/lease.py`, issue 32): one row per lease — its team, TTL, what its
expiry does, its deadline and whether it is active, expired or ended.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07

Locking: a new table and its indexes only (no lock on anything in use). Logs from before
have no lease events: the table starts empty, which is what they fold to.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("lease_id", sa.Text, primary_key=True),
        sa.Column("team_id", sa.Text, nullable=False),
        sa.Column("ttl_s", sa.Float, nullable=False),
        sa.Column("on_expiry", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True)),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_leases_status_expires", "leases", ["status", "expires_at"])
    op.create_index("ix_leases_team", "leases", ["team_id"])


def downgrade() -> None:
    op.drop_table("leases")
