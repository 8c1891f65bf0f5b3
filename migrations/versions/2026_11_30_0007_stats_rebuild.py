"""stats rollup rebuilt: the quantile sketch's buckets changed (exact buckets for multiples of 1/8 up to
64), so cells written with the old buckets are recomputed from the stored groups; no schema change.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 21:30:00

The rollup is derived data: it is rebuilt with the installed code's sketch (``service.stats.service``),
which is the one every later write and retraction uses. Offline (``--sql``) there is nothing to emit:
run ``grpo-curator stats --rebuild`` after applying the SQL. A downgrade empties the rollup (the older
code's buckets differ; rebuild it with that code: ``grpo-curator stats --rebuild``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
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
