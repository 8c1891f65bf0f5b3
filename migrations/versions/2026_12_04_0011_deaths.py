"""deaths: per-group count of score-worker deaths while the group was claimed alone (issue 26).

A score worker that dies (kill -9, OOM) with a claim gives its groups' attempt back: a worker's death is not
a scoring failure. The survivors of a dead batch are split in halves and each half is claimed together; a
group whose worker died while it was claimed alone counts it in ``groups.score_deaths``, and past
``max_solo_deaths`` it is taken for the killer (``reward_error``).

Revision ID: 0011_deaths
Revises: 0010_remedy
Create Date: 2026-12-04 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_deaths"
down_revision: str | None = "0010_remedy"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("groups", sa.Column("score_deaths", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    op.drop_column("groups", "score_deaths")
