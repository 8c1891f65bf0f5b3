"""Staleness by the oldest token: groups.oldest_version.

Revision ID: 0014_oldest_version
Revises: 0013_archive_identity
Create Date: 2026-12-05 19:30:00

Staleness read only a group's ``policy_version``: a replacement posted into a slot by an older policy (a
resample fill at version 0 into a version-5 group), or a trajectory whose per-token ``versions`` name older
policies (a resumed or partial rollout), trained as if every token were as new as the group. The column holds
the oldest policy version that generated any of the group's tokens when it is older than ``policy_version``
(NULL otherwise, so existing rows need no rewrite); every staleness check reads
``coalesce(oldest_version, policy_version)``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_oldest_version"
down_revision: str | None = "0013_archive_identity"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("groups", sa.Column("oldest_version", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("groups", "oldest_version")
