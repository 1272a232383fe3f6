"""Creates of sandboxes per template: E2B's `spawnCount` and `lastSpawnedAt` in the template
listing (they were always 0 and null), counted by the sandboxes projection from each
`SandboxCreated` of the template (a build's capture counts for its template).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06

Locking: a new table only (CREATE TABLE takes no lock on anything in use). It starts
empty: creates from before it are counted by `aenv projections rebuild`, which refolds the
sandboxes projection from the start of the log (and must reproduce the live tables).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "template_spawns",
        sa.Column("template_id", sa.Text, primary_key=True),
        sa.Column("spawn_count", sa.BigInteger, nullable=False),
        sa.Column("last_spawned_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("template_spawns")
