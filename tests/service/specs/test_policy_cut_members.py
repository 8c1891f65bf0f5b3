"""Policy creation: an environment failure is never a negative (422 naming the field, nothing stored);
`masked_in_baseline` is a stored field; migration 0009b brings stored policies in line."""

from __future__ import annotations

import hashlib

import orjson
import pytest
from sqlalchemy import create_engine, func, select, text

from filters.types import ENVIRONMENT_REASONS
from service.store.migrate import downgrade, upgrade
from service.store.models import CurationPolicyRow


@pytest.mark.parametrize("reason", [*sorted(ENVIRONMENT_REASONS), "tool_error"])
@pytest.mark.parametrize("action", ["keep", "mask", "penalize"])
def test_an_environment_reason_with_a_training_action_is_a_422(client, session, reason, action):
    r = client.post("/v1/curation-policies", json={"name": "envp", "finish_reason_actions": {reason: action}})
    assert r.status_code == 422
    assert "finish_reason_actions" in r.json()["error"] and "valid: drop, resample" in r.json()["error"]
    count = select(func.count()).select_from(CurationPolicyRow).where(CurationPolicyRow.name == "envp")
    assert session.scalar(count) == 0


@pytest.mark.parametrize("action", ["drop", "resample"])
def test_an_environment_reason_may_be_dropped_or_resampled(client, action):
    r = client.post("/v1/curation-policies", json={"name": "envok", "finish_reason_actions": {"timeout": action}})
    assert r.status_code == 201


def test_masked_in_baseline_is_stored_and_must_be_a_boolean(client):
    assert client.post("/v1/curation-policies", json={"name": "dapo", "masked_in_baseline": True}).status_code == 201
    assert client.get("/v1/curation-policies/dapo").json()["body"]["masked_in_baseline"] is True
    r = client.post("/v1/curation-policies", json={"name": "dapo2", "masked_in_baseline": "yes"})
    assert r.status_code == 422 and "masked_in_baseline" in r.json()["error"]


def _digest(body: dict) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def test_migration_0009b_rewrites_stored_policies(make_db):
    url = make_db()
    downgrade(url, "0008")
    engine = create_engine(url)
    old = {"name": "legacy", "finish_reason_actions": {"timeout": "penalize", "tool_error": "mask", "length": "keep"}}
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO curation_policies (name, version, body, body_hash) VALUES ('legacy', 1, CAST(:b AS jsonb), 'x')"),
            {"b": orjson.dumps(old).decode()},
        )
    upgrade(url)
    with engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT name, body FROM curation_policies")).all())
        hashes = dict(conn.execute(text("SELECT name, body_hash FROM curation_policies")).all())
    assert rows["legacy"]["finish_reason_actions"] == {"timeout": "drop", "tool_error": "drop", "length": "keep"}
    assert rows["legacy"]["masked_in_baseline"] is False and rows["default"]["masked_in_baseline"] is False
    assert all(hashes[name] == _digest(body) for name, body in rows.items())
    downgrade(url, "0008")
    with engine.connect() as conn:
        assert "masked_in_baseline" not in conn.execute(text("SELECT body FROM curation_policies WHERE name = 'default'")).scalar_one()
    engine.dispose()
