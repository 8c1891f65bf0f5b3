"""finish_reason tool_error split: stored rows say tool_failure (the environment's), tool_misuse is new.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 21:00:00

`tool_error` could not tell a model's bad tool call from a broken tool; it was dropped like an
environment failure, so stored rows keep that meaning under its new name `tool_failure`. New data says
`tool_misuse` (the model's mistake: scored as a failed outcome) or `tool_failure`. The wire and stored
curation policies still accept `tool_error` as `tool_failure`. A downgrade renames both back to
`tool_error` (the old code knows no other name).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _rename(old: tuple[str, ...], new: str) -> None:
    names = ", ".join(f"'{o}'" for o in old)
    op.execute(f"UPDATE trajectories SET finish_reason = '{new}' WHERE finish_reason IN ({names})")
    reasons = ", ".join(f"'finish_reason:{o}'" for o in old)
    for table, column in (("trajectories", "reason"), ("decisions", "reason")):
        op.execute(f"UPDATE {table} SET {column} = 'finish_reason:{new}' WHERE {column} IN ({reasons})")
    op.execute(f"UPDATE stats_cells SET key = '{new}' WHERE dim = 'finish_reason' AND key IN ({names})")


def upgrade() -> None:
    _rename(("tool_error",), "tool_failure")


def downgrade() -> None:
    # cells of both new names would collide under one key: the rollup is derived, rebuild it after
    op.execute("DELETE FROM stats_cells WHERE dim = 'finish_reason' AND key IN ('tool_misuse', 'tool_failure')")
    _rename(("tool_misuse", "tool_failure"), "tool_error")
