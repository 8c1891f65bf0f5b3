"""prompts.reference_from_admin: whether a prompt's reference was written by an admin key.

Revision ID: 0009a
Revises: 0009d
Create Date: 2026-12-01 22:00:00

Only an admin-written reference runs as code under a verifier.code spec (docs/security.md, "References
run as code"); the rule is now checked where the code runs (the worker's scoring stage, rescore), not only
at ingest, so it needs to know who wrote each stored reference. Existing rows cannot tell (prompts never
recorded their writer), so they are "not admin": the safe side. After upgrading, a reference that should
run as code is re-loaded by an admin (``POST /v1/prompts`` or ``grpo-curator import-prompts``), which marks
it; until then its groups under a code spec end in ``reward_error`` naming the rule (never a 0).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009a"
down_revision: str | None = "0009d"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("prompts", sa.Column("reference_from_admin", sa.Boolean(), nullable=False,
                                       server_default=sa.text("false")))


def downgrade() -> None:
    op.drop_column("prompts", "reference_from_admin")
