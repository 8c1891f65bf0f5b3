"""Versioned reward specs and curation policies; dataset attachment."""

from __future__ import annotations

from sqlalchemy import func, select

from service.store.models import RewardSpecRow

SPEC = {"name": "qa", "components": [{"name": "em", "kind": "verifier.exact_match", "outcome": True}]}


def test_versions_increase_and_same_body_is_not_a_new_version(client, session):
    assert client.post("/v1/reward-specs", json=SPEC).json() == {"name": "qa", "version": 1}
    assert client.post("/v1/reward-specs", json=SPEC).json() == {"name": "qa", "version": 1}
    changed = {**SPEC, "components": [*SPEC["components"], {"name": "f1", "kind": "verifier.f1", "weight": 0.5}]}
    assert client.post("/v1/reward-specs", json=changed).json() == {"name": "qa", "version": 2}
    assert client.get("/v1/reward-specs/qa").json()["version"] == 2
    assert client.get("/v1/reward-specs/qa", params={"version": 1}).json()["body"]["components"][0]["name"] == "em"
    assert session.scalar(select(func.count()).select_from(RewardSpecRow).where(RewardSpecRow.name == "qa")) == 2


def test_bad_spec_names_the_field_and_stores_nothing(client, session):
    r = client.post("/v1/reward-specs", json={"name": "x", "components": [{"name": "a", "kind": "rule.nope"}]})
    assert r.status_code == 422 and "components[0].kind" in r.json()["error"]
    r = client.post("/v1/reward-specs", json={"name": "x", "components": [
        {"name": "a", "kind": "verifier.math", "outcome": True}, {"name": "b", "kind": "verifier.f1", "outcome": True}]})
    assert r.status_code == 422 and "components[1].outcome" in r.json()["error"]
    assert session.scalar(select(func.count()).select_from(RewardSpecRow).where(RewardSpecRow.name == "x")) == 0


def test_curation_policy_validation(client):
    r = client.post("/v1/curation-policies", json={"name": "p", "zero_variance": {"action": "explode"}})
    assert r.status_code == 422 and "zero_variance.action" in r.json()["error"]
    r = client.post("/v1/curation-policies", json={"name": "p", "advantage": {"estimator": "rloo"}})
    assert r.status_code == 201 and r.json() == {"name": "p", "version": 1}


def test_dataset_attachment_checks_existence(client):
    r = client.put("/v1/datasets/gsm8k", json={"reward_spec": "missing"})
    assert r.status_code == 422 and "reward_spec" in r.json()["error"]
    client.post("/v1/reward-specs", json=SPEC)
    r = client.put("/v1/datasets/gsm8k", json={"reward_spec": "qa@1"})
    assert r.status_code == 200
    assert client.get("/v1/datasets/gsm8k").json() == {"name": "gsm8k", "reward_spec": "qa@1", "curation_policy": None}
    assert client.put("/v1/datasets/gsm8k", json={"reward_spec": "qa@x"}).status_code == 422


def test_the_builtin_defaults_exist_from_the_migration_and_match_the_code(client, session):
    """Migration 0004 made ``default@1`` of both; their bodies are the ones the service would create."""
    from service.specs.service import DEFAULT_POLICY, DEFAULT_SPEC

    assert client.get("/v1/reward-specs/default").json()["version"] == 1
    assert client.put("/v1/datasets/fresh", json={"reward_spec": "default", "curation_policy": "default@1"}).status_code == 200
    # posting the code's bodies finds the migrated rows (same canonical hash): no version 2
    assert client.post("/v1/reward-specs", json=DEFAULT_SPEC.model_dump(mode="json")).json()["version"] == 1
    assert client.post("/v1/curation-policies", json=DEFAULT_POLICY.model_dump(mode="json")).json()["version"] == 1
