"""Built-in example reward specs: ``math-r1``, ``code-tests``, ``agent-tools`` (docs/components.md, "Built-in specs").

Revision ID: 0010_exports
Revises: 0009a
Create Date: 2026-12-02 00:00:00

The specs the README and docs/integrations.md examples name exist in every database, as version 1 of each
name, so the examples run as written. A name that already has versions (a deployment defined its own
``math-r1``) is left alone. The bodies are frozen here (a migration never changes with the code); a
deployment changes them the usual way, ``POST /v1/reward-specs`` with the same name (a new version).
Downgrade removes each built-in version only where it is still exactly the built-in body and no group
was scored with that spec name and no dataset or prompt names it.
"""

import hashlib
from collections.abc import Sequence

import orjson
import sqlalchemy as sa
from alembic import op

revision: str = "0010_exports"
down_revision: str | None = "0009a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _component(name: str, kind: str, weight: float = 1.0, params: dict | None = None, outcome: bool = False) -> dict:
    return {"name": name, "kind": kind, "weight": weight, "params": params or {}, "outcome": outcome}


# each body is what RewardSpec.model_dump(mode="json") gives for it (tests/service/specs/test_builtin_specs.py)
BUILTIN_SPECS = [
    {"name": "math-r1", "components": [
        # the last complete <answer>...</answer> (a \boxed{} inside it, or a bare expression), else the whole text
        _component("correct", "verifier.math", 1.0, {"answer_tag": "answer"}, outcome=True),
        _component("format", "rule.format", 0.5, {"required_tags": ["answer"]}),
    ]},
    {"name": "code-tests", "components": [
        # the last ```python block (else the whole answer) against reference.tests (or reference.io), sandboxed
        _component("tests", "verifier.code", 1.0, {}, outcome=True),
    ]},
    {"name": "agent-tools", "components": [
        _component("correct", "verifier.exact_match", 1.0, {}, outcome=True),
        # valid calls against the prompt's metadata.tools, as a fraction; loops of identical calls / text
        _component("tool_calls", "rule.tool_calls", 0.2, {"mode": "fraction"}),
        _component("repetition", "rule.repetition", 0.2, {}),
    ]},
]


def _digest(body: dict) -> str:  # = service.specs.service._digest
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def upgrade() -> None:
    bind = op.get_bind()
    for body in BUILTIN_SPECS:
        exists = bind.execute(sa.text("SELECT 1 FROM reward_specs WHERE name = :n LIMIT 1"), {"n": body["name"]}).first()
        if exists is None:
            bind.execute(sa.text("INSERT INTO reward_specs (name, version, body, body_hash) "
                                 "VALUES (:n, 1, CAST(:b AS jsonb), :h)"),
                         {"n": body["name"], "b": orjson.dumps(body).decode(), "h": _digest(body)})


def downgrade() -> None:
    bind = op.get_bind()
    for body in BUILTIN_SPECS:
        bind.execute(sa.text("DELETE FROM reward_specs WHERE name = :n AND version = 1 AND body_hash = :h "
                             "AND NOT EXISTS (SELECT 1 FROM reward_specs r2 WHERE r2.name = :n AND r2.version > 1) "
                             "AND NOT EXISTS (SELECT 1 FROM groups g WHERE g.reward_spec_name = :n) "
                             "AND NOT EXISTS (SELECT 1 FROM datasets d WHERE d.reward_spec IN (:n, :n || '@1')) "
                             "AND NOT EXISTS (SELECT 1 FROM prompts p WHERE p.reward_spec IN (:n, :n || '@1'))"),
                     {"n": body["name"], "h": _digest(body)})
