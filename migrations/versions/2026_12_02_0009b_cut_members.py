"""Curation policies: `masked_in_baseline` in every stored body; an environment failure is never a negative.

Revision ID: 0009b
Revises: 0008
Create Date: 2026-12-02 09:00:00

Stored policy bodies are the full canonical dump of the policy, so posting the same policy again finds
its version by hash. The new field `masked_in_baseline` is added at its default (false) to every body,
and the hash recomputed. A stored policy giving an environment reason (tool_failure, env_error,
timeout, aborted; tool_error, the old name) an action other than drop / resample -- mask put the
failure's 0 in a baseline, keep / penalize trained it as a negative -- now says drop; the API refuses
such policies (422). The downgrade removes the field again (a policy with `masked_in_baseline: true`
then keeps masked members in the baseline, the old behaviour); the rewritten actions stay drop.
"""

import hashlib
from collections.abc import Sequence

import orjson
import sqlalchemy as sa
from alembic import op

revision: str = "0009b"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ENVIRONMENT = {"tool_failure", "env_error", "timeout", "aborted", "tool_error"}
_ALLOWED = {"drop", "resample"}


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
    body.setdefault("masked_in_baseline", False)
    actions = body.get("finish_reason_actions")
    if isinstance(actions, dict):
        body["finish_reason_actions"] = {
            reason: ("drop" if reason in _ENVIRONMENT and action not in _ALLOWED else action)
            for reason, action in actions.items()
        }
    return body


def _downgrade_body(body: dict) -> dict:
    body.pop("masked_in_baseline", None)
    return body


def upgrade() -> None:
    _rewrite(_upgrade_body)


def downgrade() -> None:
    _rewrite(_downgrade_body)
