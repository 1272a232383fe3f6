"""Partial index for the TTL timer: running sandboxes by end_at.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

Locking: CREATE INDEX CONCURRENTLY, outside a transaction (autocommit block): it takes only
a SHARE UPDATE EXCLUSIVE lock, so projections keep writing and the API keeps reading
while it builds. If it fails midway it leaves an INVALID index; the downgrade (DROP INDEX
CONCURRENTLY IF EXISTS) cleans that up before a retry.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_sandboxes_running_end_at",
            "sandboxes",
            ["end_at"],
            postgresql_where=sa.text("status = 'running'"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(
            "ix_sandboxes_running_end_at",
            table_name="sandboxes",
            postgresql_concurrently=True,
            if_exists=True,
        )
