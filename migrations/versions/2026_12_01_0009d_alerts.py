"""Alerts (issue 24): monitor settings, alert episodes and every transition.

Revision ID: 0009d
Revises: 0009e
Create Date: 2026-12-01 21:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009d"
down_revision: str | None = "0009e"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "monitor_settings",
        sa.Column("monitor", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("warning", sa.Float(), nullable=False),
        sa.Column("critical", sa.Float(), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("monitor", "scope", name=op.f("pk_monitor_settings")),
    )
    op.create_table(
        "alerts",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("monitor", sa.Text(), nullable=False),
        sa.Column("dataset", sa.Text(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("opened_version", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("threshold", sa.Float(), nullable=True),
        sa.Column("evidence", postgresql.JSONB(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
    )
    op.create_index("ix_alerts_open", "alerts", ["monitor", "dataset", "state"])
    op.create_table(
        "alert_transitions",
        sa.Column("pk", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("alert_id", sa.Text(), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=False),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["alert_id"], ["alerts.id"], name=op.f("fk_alert_transitions_alert_id_alerts"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("pk", name=op.f("pk_alert_transitions")),
    )
    op.create_index(op.f("ix_alert_transitions_alert_id"), "alert_transitions", ["alert_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_alert_transitions_alert_id"), table_name="alert_transitions")
    op.drop_table("alert_transitions")
    op.drop_index("ix_alerts_open", table_name="alerts")
    op.drop_table("alerts")
    op.drop_table("monitor_settings")
