"""The node that took a persistent snapshot (its capture lives there).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

Creates from a snapshot go to the node holding its capture. That was read from the source
sandbox's current node, which is wrong once the sandbox moved (a resume on another node
after its own was gone). Rows from before this revision keep NULL and are answered the old
way; `aenv projections rebuild` fills them from the events.

Locking: ADD COLUMN without a default is a catalog-only change (a brief ACCESS EXCLUSIVE
lock, no table rewrite).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("snapshots", sa.Column("node_id", sa.Text))


def downgrade() -> None:
    op.drop_column("snapshots", "node_id")
