"""Resume through the agent gateway: a session may continue a cut member from its checkpoint
(docs/agents.md, "Resume a cut member").

Revision ID: 0011_session_resume
Revises: 0010_remedy
Create Date: 2026-12-04 00:00:00

- ``agent_sessions.resume``: ``{"group_id", "index", "request_id"}`` of the resume slot a session fills, or
  null for an ordinary session. Such a session's trajectory starts from the slot's checkpoint and, on
  finish, fills that slot of its group instead of forming a group of its own.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0011_session_resume"
down_revision: str | None = "0011_deaths"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("agent_sessions", sa.Column("resume", JSONB, nullable=True))


def downgrade() -> None:
    op.drop_column("agent_sessions", "resume")
