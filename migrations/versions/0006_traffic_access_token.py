"""A sandbox's traffic access token (E2B's `trafficAccessToken`, `allowPublicTraffic=false`).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

`GET /sandboxes/{id}` shows it from the read model. Rows from before this revision keep
NULL, which is right: no sandbox created before it was closed to public traffic.

Locking: ADD COLUMN without a default: a catalog-only change.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("sandboxes", sa.Column("traffic_access_token", sa.Text))


def downgrade() -> None:
    op.drop_column("sandboxes", "traffic_access_token")
