"""defaults and ready notifications: the built-in ``default`` reward spec and curation policy, and a
``NOTIFY grpo_curator_ready`` whenever a group becomes ready (long-polling leases wait on it).

The two bodies are frozen here as they were when this revision was written; a database that already
holds a ``default`` (the service used to create it on first use) keeps its own. The trigger sends one
notification per transaction (PostgreSQL folds identical notifications of one transaction), delivered
at commit, so a waiting lease wakes only for groups it can see.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 20:30:00
"""

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHANNEL = "grpo_curator_ready"

_DEFAULT_SPEC = {
    "name": "default",
    "components": [{"name": "correct", "kind": "verifier.math", "weight": 1.0, "params": {}, "outcome": True}],
}
_DEFAULT_SPEC_HASH = "7a569fe7382c4cf2ac25c6095c81947353ec0306c8ebc3f03d90af1f75f53f63"
_DEFAULT_POLICY = {
    "name": "default",
    "zero_variance": {"metric": "outcome", "eps": 1e-6, "action": "drop", "pass_rate_band": None},
    "finish_reason_actions": {},
    "max_staleness": None,
    "min_group_size": 2,
    "advantage": {"estimator": "grpo", "std": "population", "eps": 1e-6},
    "overlong_buffer": 0.2,
    "penalty": -1.0,
    "resample_budget_multiplier": 2.0,
    "reward_error": "drop",
    "curriculum": {"k": 3, "solved": 1.0, "failed": 0.0, "low_priority": 0.1},
    "soft_overlong": False,
}
_DEFAULT_POLICY_HASH = "0f431c354deac0034f6ab97ccd132cfb7951deb065c1b8c9b3bb3bfd70b11f9a"

_INSERT = """
INSERT INTO {table} (name, version, body, body_hash)
SELECT 'default', 1, CAST(:body AS jsonb), :hash
WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE name = 'default')
"""


def upgrade() -> None:
    for table, body, digest in (
        ("reward_specs", _DEFAULT_SPEC, _DEFAULT_SPEC_HASH),
        ("curation_policies", _DEFAULT_POLICY, _DEFAULT_POLICY_HASH),
    ):
        op.get_bind().execute(sa.text(_INSERT.format(table=table)), {"body": json.dumps(body), "hash": digest})
    op.execute(
        f"""
        CREATE FUNCTION grpo_curator_notify_ready() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', '');
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER groups_notify_ready AFTER INSERT OR UPDATE OF status ON groups
        FOR EACH ROW WHEN (NEW.status = 'ready') EXECUTE FUNCTION grpo_curator_notify_ready()
        """
    )


def downgrade() -> None:
    """Drops the trigger; the ``default`` rows stay (the service would create the same on first use)."""
    op.execute("DROP TRIGGER groups_notify_ready ON groups")
    op.execute("DROP FUNCTION grpo_curator_notify_ready()")
