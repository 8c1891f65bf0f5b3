"""Archive identity: a random id per database that its archived files' names carry (service.archive).

Revision ID: 0013_archive_identity
Revises: 0012_alert_outbox
Create Date: 2026-12-05 10:00:00

Two databases archiving to one target overwrote each other's files (names came from group pks only) and each
run deleted the other's files as unrecorded. The archiver draws the id on its first run (not here: a database
copied from a migrated template must not share it); files written before it keep their names and are never
deleted as orphans.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_archive_identity"
down_revision: str | None = "0012_alert_outbox"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "archive_identity",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("database_oid", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_archive_identity")),
    )


def downgrade() -> None:
    op.drop_table("archive_identity")
