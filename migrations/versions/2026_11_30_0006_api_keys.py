"""api keys: hashed API keys with roles, and the key name recorded on what a key writes (audit).

Revision ID: 0006
Revises: 0003
Create Date: 2026-11-30 20:15:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("datasets", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("name", name=op.f("uq_api_keys_name")),
    )
    op.add_column("groups", sa.Column("producer_key", sa.Text(), nullable=True))
    op.add_column("leases", sa.Column("api_key", sa.Text(), nullable=True))
    op.add_column("policy_versions", sa.Column("publisher_key", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("policy_versions", "publisher_key")
    op.drop_column("leases", "api_key")
    op.drop_column("groups", "producer_key")
    op.drop_table("api_keys")
