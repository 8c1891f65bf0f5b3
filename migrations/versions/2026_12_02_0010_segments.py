"""Segmented trajectories: trajectories.segments / segment_advantages; the segment policy fields.

Revision ID: 0010_segments
Revises: 0009a
Create Date: 2026-12-02 12:00:00

A trajectory may be stored as ordered segments (docs/api.md, "Segmented trajectories"): its token_ids,
loss_mask and logprobs hold the segments concatenated in order and ``segments`` (jsonb, null for an
unsegmented trajectory) their lengths and messages; curation writes one advantage per segment into
``segment_advantages``. Stored curation-policy bodies are the full canonical dump, so the new fields
``segment_advantage`` (broadcast) and ``segment_discount`` (0.9) are added at their defaults and the hash
recomputed. The downgrade removes both columns and fields (a segmented trajectory's segments are lost:
its arrays stay, concatenated, as one sequence).
"""

import hashlib
from collections.abc import Sequence

import orjson
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0010_segments"
down_revision: str | None = "0010_exports"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FIELDS = {"segment_advantage": "broadcast", "segment_discount": 0.9}


def _digest(body: dict) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _rewrite(change) -> None:
    bind = op.get_bind()
    rows = bind.execute(sa.text("SELECT name, version, body FROM curation_policies")).all()
    update = sa.text(
        "UPDATE curation_policies SET body = CAST(:body AS jsonb), body_hash = :hash"
        " WHERE name = :name AND version = :version"
    )
    for name, version, body in rows:
        new = change(dict(body))
        if new != body:
            params = {"body": orjson.dumps(new).decode(), "hash": _digest(new), "name": name, "version": version}
            bind.execute(update, params)


def _upgrade_body(body: dict) -> dict:
    for key, value in _FIELDS.items():
        body.setdefault(key, value)
    return body


def _downgrade_body(body: dict) -> dict:
    for key in _FIELDS:
        body.pop(key, None)
    return body


def upgrade() -> None:
    op.add_column("trajectories", sa.Column("segments", JSONB, nullable=True))
    op.add_column("trajectories", sa.Column("segment_advantages", JSONB, nullable=True))
    _rewrite(_upgrade_body)


def downgrade() -> None:
    _rewrite(_downgrade_body)
    op.drop_column("trajectories", "segment_advantages")
    op.drop_column("trajectories", "segments")
