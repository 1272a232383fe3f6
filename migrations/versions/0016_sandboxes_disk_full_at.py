"""When a sandbox's guest last filled its own root disk (`SandboxDiskFull`): shown by
`GET /sandboxes/{id}` and the console.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06

Locking: ADD COLUMN without a default: a catalog-only change (ACCESS EXCLUSIVE for a
moment), no rewrite. Rows written before it have NULL, which is right: no guest filled
its disk before the event existed.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("sandboxes", sa.Column("disk_full_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("sandboxes", "disk_full_at")
