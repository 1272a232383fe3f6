"""API keys' admission limits (`domain/limits.py`, issue 32): one JSONB column of the
overrides a key sets (max running sandboxes, creates per second, burst); and a partial
index of the sandboxes holding a VM by team, which admission control counts on every
create (`projections/census.py`): killed rows are never deleted, so without it the count
reads every sandbox the team ever had.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07

Locking: ADD COLUMN with a constant default is a catalog change only (PostgreSQL 11+): a
brief ACCESS EXCLUSIVE lock on api_keys, no rewrite. Logs from before have no
ApiKeyLimitsSet: every key folds to no override, which is the default. The index: CREATE
INDEX CONCURRENTLY in an autocommit block (SHARE UPDATE EXCLUSIVE only: projections keep
writing); a failed build leaves an INVALID index that the downgrade drops before a retry.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


#: `projections.census.HOLDS_A_VM`, as the migration fixes it
_HOLDS_A_VM = "status IN ('creating', 'running', 'pausing', 'resuming', 'snapshotting', 'forking')"


def upgrade() -> None:
    op.add_column(
        "api_keys",
        sa.Column("limits", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    )
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_sandboxes_team_holding_vm",
            "sandboxes",
            ["team_id"],
            postgresql_where=sa.text(_HOLDS_A_VM),
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(
            "ix_sandboxes_team_holding_vm",
            table_name="sandboxes",
            postgresql_concurrently=True,
            if_exists=True,
        )
    op.drop_column("api_keys", "limits")
