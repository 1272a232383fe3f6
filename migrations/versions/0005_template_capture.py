"""Where a snapshot template's capture is durable (the snapshot repository key).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

The API sends a create from a snapshot whose node is gone to placement when the capture
is in the repository; it reads that here. Rows from before this revision keep NULL (not
known durable) until `aenv projections rebuild` refolds them.

Locking: ADD COLUMN without a default, twice: catalog-only changes.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("templates", sa.Column("capture_key", sa.Text))
    op.add_column("templates", sa.Column("capture_of", sa.Text))


def downgrade() -> None:
    op.drop_column("templates", "capture_of")
    op.drop_column("templates", "capture_key")
