"""What a node without a template stores to create from it (images-at-scale S9: placement
by disk): its durable capture's bytes, and the image and runtime disks under it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06

Rows from before this revision keep NULL (sizes unknown: placement counts only the
headroom) until the next upload of the template, or `aenv projections rebuild` (uploads
recorded before sizes were fold to NULL too).

Locking: ADD COLUMN without a default, twice: catalog-only changes.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("templates", sa.Column("capture_bytes", sa.BigInteger))
    op.add_column("templates", sa.Column("image_bytes", sa.BigInteger))


def downgrade() -> None:
    op.drop_column("templates", "image_bytes")
    op.drop_column("templates", "capture_bytes")
