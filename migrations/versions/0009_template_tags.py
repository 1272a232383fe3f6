"""Template tags: a built template's tags (`name:tag` → the build and the capture its
sandboxes restore) and the captures no tag names any more, waiting to be dropped.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03

Both mirror the template aggregate's state (`domain/template/`), as JSONB on its row: the
create path resolves a tag with the one lookup it already does, and the API's capture
sweeper reads `released`. Rows from before this revision get `{}`: untagged, whose
`default` is the template's own capture — which is what their log folds to as well, so a
rebuild reproduces them.

Locking: ADD COLUMN with a constant default, twice (Postgres 11+: no table rewrite): a
catalog-only change under a brief ACCESS EXCLUSIVE lock.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for column in ("tags", "released"):
        op.add_column(
            "templates",
            sa.Column(column, JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        )


def downgrade() -> None:
    op.drop_column("templates", "released")
    op.drop_column("templates", "tags")
