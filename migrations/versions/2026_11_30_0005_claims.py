"""claims: score-worker claim leases on groups, and a reason on ended leases.

A score worker claims groups by writing ``claimed_by`` (a token unique to the claim) and ``claimed_until``
and commits; it scores with no transaction open and writes its results only where the claim still holds.
``leases.reason`` records why a trainer nacked a batch. The new group status ``curation_error`` needs no
schema change (``status`` is free text).

Revision ID: 0005
Revises: 0003
Create Date: 2026-11-30 20:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("groups", sa.Column("claimed_by", sa.Text(), nullable=True))
    op.add_column("groups", sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True))
    op.add_column("leases", sa.Column("reason", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("leases", "reason")
    op.drop_column("groups", "claimed_until")
    op.drop_column("groups", "claimed_by")
