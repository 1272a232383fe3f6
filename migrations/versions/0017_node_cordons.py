"""Node cordons (`domain/node.py`, issue 30): one row per node an operator cordoned or
uncordoned — whether it takes new sandboxes, and why not.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07

Locking: a new table only (no lock on anything in use). Logs from before have no node
events: the table starts empty, which is what they fold to (no node cordoned).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_cordons",
        sa.Column("node_id", sa.Text, primary_key=True),
        sa.Column("cordoned", sa.Boolean, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("cordoned_at", sa.DateTime(timezone=True)),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("node_cordons")
