"""Alerts: partial monitor settings, a per-dataset pause scope, and a durable notification outbox.

Revision ID: 0012_alert_outbox
Revises: 0011_archive
Create Date: 2026-12-04 20:30:00

- ``monitor_settings.warning / critical / action`` become nullable: NULL inherits (a dataset's row from the
  overall row, the overall row from the monitor's defaults), so a PUT that names one field keeps the rest.
- ``monitor_settings.pause_scope``: ``per_dataset`` on an overall row makes ``pause_leases`` pause only the
  datasets whose own alert is critical (the overall alert notifies); NULL = the overall alert pauses all.
- ``alert_transitions.notified_at`` / ``notify_attempts`` / ``notify_after``: the webhook outbox; the worker
  posts rows whose ``notified_at`` is NULL (the transitions already stored are marked notified).
- ``alert_cursor``: the policy version of the last evaluation, so a spike monitor scores every version since.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_alert_outbox"
down_revision: str | None = "0011_death_tokens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for column in ("warning", "critical", "action"):
        op.alter_column("monitor_settings", column, nullable=True)
    op.add_column("monitor_settings", sa.Column("pause_scope", sa.String(16), nullable=True))
    op.add_column("alert_transitions", sa.Column("notified_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("alert_transitions", sa.Column("notify_attempts", sa.Integer(), server_default="0", nullable=False))
    op.add_column("alert_transitions", sa.Column("notify_after", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE alert_transitions SET notified_at = at")
    op.create_table(
        "alert_cursor",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("since", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_alert_cursor")),
    )
    op.create_index("ix_alert_transitions_unnotified", "alert_transitions", ["pk"],
                    postgresql_where=sa.text("notified_at IS NULL"))


def downgrade() -> None:
    op.drop_index("ix_alert_transitions_unnotified", table_name="alert_transitions")
    op.drop_table("alert_cursor")
    for column in ("notify_after", "notify_attempts", "notified_at"):
        op.drop_column("alert_transitions", column)
    op.drop_column("monitor_settings", "pause_scope")
    op.execute("DELETE FROM monitor_settings WHERE warning IS NULL OR critical IS NULL OR action IS NULL")
    for column in ("warning", "critical", "action"):
        op.alter_column("monitor_settings", column, nullable=False)
