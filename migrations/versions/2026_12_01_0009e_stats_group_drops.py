"""stats rollup rebuilt: ``drop_fraction`` now counts the members of groups dropped as a whole
(``untrainable``, ``stale``, a trainer's refusal) by the group's drop reason, so cells written before are
recomputed from the stored groups; no schema change.

Revision ID: 0009e
Revises: 0009c
Create Date: 2026-12-01 21:40:00

The rollup is derived data, rebuilt with the installed code (``service.stats.service.rebuild``). Offline
(``--sql``) there is nothing to emit: run ``grpo-curator stats --rebuild`` after applying the SQL. A
downgrade empties the rollup (rebuild it with the older code: ``grpo-curator stats --rebuild``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009e"
down_revision: str | None = "0009c"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_context().as_sql:
        return
    from sqlalchemy.orm import Session

    from service.stats.service import rebuild

    with Session(bind=op.get_bind()) as session:  # joins the migration's transaction
        rebuild(session)
        session.flush()


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM stats_cells"))
