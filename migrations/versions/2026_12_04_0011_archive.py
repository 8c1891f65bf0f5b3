"""Archive: finished groups move from the hot tables to Parquet files (docs/operations.md, "Archive").

Revision ID: 0011_archive
Revises: 0010_remedy
Create Date: 2026-12-04 00:00:00

- ``archive_files``: every Parquet file the archiver recorded (``all`` or ``effective``, one dataset and
  day, the pk range of its groups); a file that is not listed here is an orphan of an interrupted run.
- ``group_tombstones``: one small row per archived group (its id, idempotency hash, final status and the
  file it went to), so a re-post of its id is still answered (200 same body, 409 another) and
  ``GET /v1/groups/{id}`` says where it is.
- ``stats_archived_cells``: the archived groups' share of the stats rollup (``stats_cells``' shape), so a
  rebuild of the rollup from the hot tables keeps them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0011_archive"
down_revision: str | None = "0011_session_resume"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "archive_files",
        sa.Column("pk", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("location", sa.Text(), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("dataset", sa.Text(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("first_pk", sa.BigInteger(), nullable=False),
        sa.Column("last_pk", sa.BigInteger(), nullable=False),
        sa.Column("n_groups", sa.Integer(), nullable=False),
        sa.Column("n_rows", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("pk", name="pk_archive_files"),
        sa.UniqueConstraint("location", name="uq_archive_files_location"),
    )
    op.create_index("ix_archive_files_kind_first_pk", "archive_files", ["kind", "first_pk"])
    op.create_table(
        "group_tombstones",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("pk", sa.BigInteger(), nullable=False),
        sa.Column("body_hash", sa.String(64), nullable=False),
        sa.Column("prompt_id", sa.Text(), nullable=False),
        sa.Column("dataset", sa.Text(), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("drop_reason", sa.Text(), nullable=True),
        sa.Column("n_trajectories", sa.Integer(), nullable=False),
        sa.Column("group_created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("file_pk", sa.BigInteger(), nullable=False),
        sa.Column("archived_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_group_tombstones"),
        sa.ForeignKeyConstraint(["file_pk"], ["archive_files.pk"], name="fk_group_tombstones_file_pk_archive_files"),
    )
    op.create_index("ix_group_tombstones_file_pk", "group_tombstones", ["file_pk"])
    op.create_table(
        "stats_archived_cells",
        sa.Column("dim", sa.String(16), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("dataset", sa.Text(), nullable=False),
        sa.Column("bucket", sa.DateTime(timezone=True), nullable=False),
        sa.Column("counters", JSONB(), nullable=False),
        sa.PrimaryKeyConstraint("dim", "key", "dataset", "bucket", name="pk_stats_archived_cells"),
    )


def downgrade() -> None:
    op.drop_table("stats_archived_cells")
    op.drop_index("ix_group_tombstones_file_pk", table_name="group_tombstones")
    op.drop_table("group_tombstones")
    op.drop_index("ix_archive_files_kind_first_pk", table_name="archive_files")
    op.drop_table("archive_files")
