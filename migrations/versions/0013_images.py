"""Images (the fleet's one build of each recipe, `domain/image`): one row per recipe.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07

`images` mirrors the image aggregate's state: the digest a recipe is published as (what
the repository stores as `image-<digest>`, its stored and apparent size, its role, who
published it), the node that holds the claim to build it and until when, and the last
failed build. Nodes decide on the log itself; this is for operators and the janitor.

Locking: a new table, no lock on anything in use.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "images",
        sa.Column("image_id", sa.Text, primary_key=True),
        sa.Column("status", sa.Text, nullable=False),  # empty | claimed | published | failed
        sa.Column("claim_node", sa.Text),
        sa.Column("claim_since", sa.DateTime(timezone=True)),
        sa.Column("claim_until", sa.DateTime(timezone=True)),
        sa.Column("digest", sa.Text),
        sa.Column("stored_bytes", sa.BigInteger),
        sa.Column("size", sa.BigInteger),
        sa.Column("role", sa.Text),
        sa.Column("published_node", sa.Text),
        sa.Column("published_at", sa.DateTime(timezone=True)),
        sa.Column("failure_node", sa.Text),
        sa.Column("failure_reason", sa.Text),
        sa.Column("failed_at", sa.DateTime(timezone=True)),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("images")
