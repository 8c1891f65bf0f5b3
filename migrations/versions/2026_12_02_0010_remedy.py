"""Remedies in place: resample / resume fill a slot of the same group (docs/curation.md, "Remedies").

Revision ID: 0010_remedy
Revises: 0009a
Create Date: 2026-12-02 00:00:00

- ``trajectories.versions``: per-token policy versions (int32 little-endian bytea, -1 for tokens the model
  did not generate), optional; a resumed trajectory mixes the version that sampled its checkpoint and the
  one that continued it.
- ``groups.wait_until``: a group in status ``waiting`` waits for its remedy slots until then.
- ``sampling_requests``: a resample / resume request names the slot it fills (``idx``, with
  ``source_group_pk``), a resume request carries its ``checkpoint``; ``filled_at`` / ``fill_hash`` record the
  replacement a producer posted (idempotent fills), status ``expired`` a slot whose deadline passed.
- every stored curation policy gains ``max_resumes`` (2) and ``resample_wait_seconds``, and its hash is
  recomputed: a policy that already used ``resample`` gets 0 (it keeps what it did before this revision: train
  at once and ask for a fresh group), any other the code's default 300 (it has no slot to wait for).
"""

import hashlib
from collections.abc import Callable, Sequence

import orjson
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0010_remedy"
down_revision: str | None = "0010_segments"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _rewrite(change: Callable[[dict], dict]) -> None:
    bind = op.get_bind()
    rows = bind.execute(sa.text("SELECT name, version, body FROM curation_policies")).all()
    update = sa.text("UPDATE curation_policies SET body = CAST(:body AS jsonb), body_hash = :hash"
                     " WHERE name = :name AND version = :version")
    for name, version, body in rows:
        new = change(dict(body))
        if new != body:
            digest = hashlib.sha256(orjson.dumps(new, option=orjson.OPT_SORT_KEYS)).hexdigest()
            bind.execute(update, {"body": orjson.dumps(new).decode(), "hash": digest, "name": name, "version": version})


def _upgrade_body(body: dict) -> dict:
    uses_resample = "resample" in (body.get("finish_reason_actions") or {}).values()
    body.setdefault("resample_wait_seconds", 0.0 if uses_resample else 300.0)
    body.setdefault("max_resumes", 2)
    return body


def _downgrade_body(body: dict) -> dict:
    body.pop("resample_wait_seconds", None)
    body.pop("max_resumes", None)
    return body


def upgrade() -> None:
    _rewrite(_upgrade_body)
    op.add_column("trajectories", sa.Column("versions", sa.LargeBinary(), nullable=True))
    op.add_column("groups", sa.Column("wait_until", sa.DateTime(timezone=True), nullable=True))
    op.add_column("sampling_requests", sa.Column("idx", sa.SmallInteger(), nullable=True))
    op.add_column("sampling_requests", sa.Column("checkpoint", JSONB(), nullable=True))
    op.add_column("sampling_requests", sa.Column("filled_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("sampling_requests", sa.Column("fill_hash", sa.String(64), nullable=True))
    op.create_index("ix_sampling_requests_slot", "sampling_requests", ["source_group_pk", "idx"],
                    postgresql_where=sa.text("idx IS NOT NULL"))
    op.create_index("ix_groups_waiting", "groups", ["wait_until"], postgresql_where=sa.text("status = 'waiting'"))


def downgrade() -> None:
    _rewrite(_downgrade_body)
    op.drop_index("ix_groups_waiting", table_name="groups")
    op.drop_index("ix_sampling_requests_slot", table_name="sampling_requests")
    for column in ("fill_hash", "filled_at", "checkpoint", "idx"):
        op.drop_column("sampling_requests", column)
    op.drop_column("groups", "wait_until")
    op.drop_column("trajectories", "versions")
