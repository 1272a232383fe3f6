"""Builds discarded by `DELETE /templates/{id}` of a template no build of it published (its
only builds failed): the listing showed such a template, and the delete answered 404.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06

Locking: ADD COLUMN with a constant default (Postgres 11+: no table rewrite, a catalog-only
change under ACCESS EXCLUSIVE for a moment). Rows of builds from before get false, which is
what their log folds to (no `TemplateBuildDiscarded` existed).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "template_builds",
        sa.Column("discarded", sa.Boolean, nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("template_builds", "discarded")
