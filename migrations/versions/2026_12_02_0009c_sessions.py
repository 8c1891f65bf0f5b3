"""agent sessions: the gateway's sessions and every call they made (service.sessions).

Revision ID: 0009c
Revises: 0009b
Create Date: 2026-12-02 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0009c"
down_revision: str | None = "0009b"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agent_sessions",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("group_size", sa.Integer(), nullable=False),
        sa.Column("prompt_id", sa.Text(), nullable=False),
        sa.Column("prompt", JSONB(), nullable=True),
        sa.Column("dataset", sa.Text(), nullable=True),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.Column("metadata", JSONB(), nullable=False),
        sa.Column("producer_key", sa.Text(), nullable=True),
        sa.Column("producer_role", sa.String(16), nullable=False),
        sa.Column("producer_datasets", JSONB(), nullable=True),
        sa.Column("upstream", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False, server_default="open"),
        sa.Column("n_calls", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("n_tokens", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("misuse", sa.Text(), nullable=True),
        sa.Column("finish_reason", sa.String(16), nullable=True),
        sa.Column("final_answer", sa.Text(), nullable=True),
        sa.Column("rewards", JSONB(), nullable=False, server_default="{}"),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ingested_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_agent_sessions_group_id", "agent_sessions", ["group_id"])
    op.create_table(
        "session_calls",
        sa.Column("session_id", sa.String(32), sa.ForeignKey("agent_sessions.id", ondelete="CASCADE",
                  name="fk_session_calls_session_id_agent_sessions"), primary_key=True),
        sa.Column("idx", sa.Integer(), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("request", JSONB(), nullable=False),
        sa.Column("response", JSONB(), nullable=True),
        sa.Column("prompt_ids", sa.LargeBinary(), nullable=True),
        sa.Column("completion_ids", sa.LargeBinary(), nullable=True),
        sa.Column("logprobs", sa.LargeBinary(), nullable=True),
        sa.Column("finish_reason", sa.Text(), nullable=True),
        sa.Column("policy_version", sa.Integer(), nullable=True),
        sa.Column("upstream", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("misuse", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("session_calls")
    op.drop_index("ix_agent_sessions_group_id", table_name="agent_sessions")
    op.drop_table("agent_sessions")
