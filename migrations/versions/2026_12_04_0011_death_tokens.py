"""death_tokens: the claim tokens of the solo deaths a group counts (issue 26, a live worker's lapse).

A claim of one group whose heartbeat lapsed counts a death of that group (``score_deaths``); the dead
claim's token is kept with it in ``groups.death_tokens``, so when the worker holding that token turns out
to be alive (its late write is fenced: a DB failover or a pause longer than the claim) it takes that death
back, and an innocent group is not taken for the killer of a worker that never died.

Revision ID: 0011_death_tokens
Revises: 0011_archive
Create Date: 2026-12-04 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011_death_tokens"
down_revision: str | None = "0011_archive"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("groups", sa.Column("death_tokens", postgresql.ARRAY(sa.Text()), server_default="{}",
                                      nullable=False))


def downgrade() -> None:
    op.drop_column("groups", "death_tokens")
