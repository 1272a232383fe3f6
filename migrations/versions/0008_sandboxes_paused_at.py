"""When a paused sandbox was paused (paused sandboxes are kept `AENV_PAUSED_RETENTION_S`),
and whether its timeout's pause keeps memory (`lifecycle.pause_memory`): the timer starts
from the read model.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

Locking: ADD COLUMN without a default (`paused_at`), and with a constant default
(`pause_memory`, Postgres 11+: no rewrite): catalog-only changes (ACCESS EXCLUSIVE for a
moment). Rows of sandboxes paused before it have NULL; the timer counts their retention
from the row's last change.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("sandboxes", sa.Column("paused_at", sa.DateTime(timezone=True)))
    op.add_column(
        "sandboxes", sa.Column("pause_memory", sa.Boolean, nullable=False, server_default=sa.true())
    )


def downgrade() -> None:
    op.drop_column("sandboxes", "pause_memory")
    op.drop_column("sandboxes", "paused_at")
