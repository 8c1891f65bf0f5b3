"""The remedy log counted in the stats rollup: cells of dim ``remedy`` (no schema change).

Revision ID: 0017_remedy_cells
Revises: 0016_prompt_prefixes
Create Date: 2026-12-06 16:30:00

``GET /v1/stats`` answered its ``remedies`` (resample / resume steps requested, filled, unfilled, exhausted)
by counting decision rows on every request: a scan of the whole decision log (1 M decision rows: ~110 ms a
request on the 2-core dev box, growing with the store), and the steps of archived groups vanished with
their groups rows. The steps are now counted in ``stats_cells`` as they are logged (dim ``remedy``, key the
remedy, counters by step, bucketed by the hour of the step), kept in ``stats_archived_cells`` when their
groups are archived, and recomputed by a rebuild. Upgrade counts the steps of every stored group with the
installed code (``service.stats.service.stored_remedy_cells``); steps of groups archived before this
revision are not in the archive's cells and stay uncounted. Offline (``--sql``) there is nothing to emit:
run ``grpo-curator stats --rebuild`` after applying the SQL. Downgrade deletes the remedy cells (the older
code counts decision rows again).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017_remedy_cells"
down_revision: str | None = "0016_prompt_prefixes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_context().as_sql:
        return
    from sqlalchemy.orm import Session

    from service.stats import repository as repo
    from service.stats.service import stored_remedy_cells

    with Session(bind=op.get_bind()) as session:  # joins the migration's transaction
        repo.add_to_cells(session, stored_remedy_cells(session))
        session.flush()


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM stats_cells WHERE dim = 'remedy'"))
    op.execute(sa.text("DELETE FROM stats_archived_cells WHERE dim = 'remedy'"))
