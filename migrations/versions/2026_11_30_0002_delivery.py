"""delivery: a partial index for the lease reaper (active leases by deadline).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_leases_active_expires_at",
        "leases",
        ["expires_at"],
        unique=False,
        postgresql_where=sa.text("status = 'active'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_leases_active_expires_at", table_name="leases", postgresql_where=sa.text("status = 'active'")
    )
