"""A group's shared prompt tokens stored once: table prompt_prefixes, trajectories.prefix_len.

Revision ID: 0016_prompt_prefixes
Revises: 0015_partitions
Create Date: 2026-12-06 12:00:00

Every member of a group repeats the group's prompt in its token_ids, loss_mask, logprobs and versions. Ingest
now stores the longest prefix its members share byte for byte in all four (when it is long enough) once, in
``prompt_prefixes`` (one row per group, partitioned by RANGE (group_pk) like trajectories: a range's
partition is created and dropped with the others, service.store.partitions), and each member keeps only
what follows it, with ``prefix_len`` (its length in tokens). Reads put the two back together in SQL.

Upgrade adds the table (a partition for every range not dropped, and DEFAULT) and the column ``prefix_len``
NOT NULL DEFAULT 0: a catalog change, no rewrite; every stored row stays as it is, whole (prefix_len 0), and
only groups ingested from now on are deduplicated. Downgrade writes the prefixes back into their members
(the arrays whole again), then drops the column and the table.
"""

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0016_prompt_prefixes"
down_revision: str | None = "0015_partitions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "parts"
ARRAYS = ("token_ids", "loss_mask", "logprobs", "versions")


def upgrade() -> None:
    op.execute(
        "CREATE TABLE prompt_prefixes (group_pk bigint NOT NULL, token_ids bytea NOT NULL, loss_mask bytea,"
        " logprobs bytea, versions bytea, CONSTRAINT pk_prompt_prefixes PRIMARY KEY (group_pk))"
        " PARTITION BY RANGE (group_pk)"
    )
    ranges = op.get_bind().execute(text("SELECT lo_pk, hi_pk FROM partitions WHERE dropped_at IS NULL"))
    for lo, hi in ranges.all():
        op.execute(f"CREATE TABLE {SCHEMA}.prompt_prefixes_p{lo:012d} PARTITION OF prompt_prefixes"
                   f" FOR VALUES FROM ({lo}) TO ({hi})")
    op.execute(f"CREATE TABLE {SCHEMA}.prompt_prefixes_default PARTITION OF prompt_prefixes DEFAULT")
    op.execute("ALTER TABLE trajectories ADD COLUMN prefix_len integer NOT NULL DEFAULT 0")


def downgrade() -> None:
    whole = ", ".join(f"{c} = p.{c} || t.{c}" for c in ARRAYS)
    op.execute(f"UPDATE trajectories t SET {whole}, prefix_len = 0 FROM prompt_prefixes p"
               " WHERE p.group_pk = t.group_pk AND t.prefix_len > 0")
    op.execute("ALTER TABLE trajectories DROP COLUMN prefix_len")
    op.execute("DROP TABLE prompt_prefixes")  # its partitions with it
