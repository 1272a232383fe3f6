"""Partial index for the TTL timer's start: the sandboxes not killed.

The timer starts from the read model's clocks of every sandbox that is not killed
(`projections.queries.timer_start`); killed rows are never deleted, so at scale they are
nearly all of the table and the start would scan it whole.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

Locking: CREATE INDEX CONCURRENTLY in an autocommit block (SHARE UPDATE EXCLUSIVE only:
projections keep writing, the API keeps reading); a failed build leaves an INVALID index
that the downgrade drops before a retry.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_sandboxes_not_killed",
            "sandboxes",
            ["sandbox_id"],
            postgresql_where=sa.text("status <> 'killed'"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(
            "ix_sandboxes_not_killed",
            table_name="sandboxes",
            postgresql_concurrently=True,
            if_exists=True,
        )
