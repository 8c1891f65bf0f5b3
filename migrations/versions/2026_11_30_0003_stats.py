"""stats: the pre-aggregated reward-statistics rollup (stats_cells).

Cells are maintained by the curation stage (service.stats.service.record_groups). A database that
already holds curated groups when this migration runs fills its cells with ``POST /v1/stats/rebuild``
(or ``grpo-curator stats --rebuild``); the migration itself does not read the groups.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 18:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("CREATE SEQUENCE stats_cells_version_seq")
    op.create_table(
        "stats_cells",
        sa.Column("dim", sa.String(length=16), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("dataset", sa.Text(), nullable=False),
        sa.Column("bucket", sa.DateTime(timezone=True), nullable=False),
        sa.Column("counters", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "version",
            sa.BigInteger(),
            server_default=sa.text("nextval('stats_cells_version_seq')"),
            nullable=False,
        ),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("dim", "key", "dataset", "bucket", name=op.f("pk_stats_cells")),
    )


def downgrade() -> None:
    op.drop_table("stats_cells")
    op.execute("DROP SEQUENCE stats_cells_version_seq")
