"""The built-in example specs (migration 0010_exports): math-r1, code-tests, agent-tools exist in every
database, are valid specs, and the docs' examples that name them run as written."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import sqlalchemy as sa

from reward_models.spec import RewardSpec
from service.store.db import to_sqlalchemy_url
from service.store.migrate import downgrade, upgrade

ROOT = Path(__file__).resolve().parents[3]


def _migration():
    path = next((ROOT / "migrations" / "versions").glob("*_0010_exports_*.py"))
    spec = importlib.util.spec_from_file_location("m0010_exports", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILTIN = _migration().BUILTIN_SPECS


@pytest.mark.parametrize("body", BUILTIN, ids=[b["name"] for b in BUILTIN])
def test_each_builtin_is_a_valid_spec_stored_as_the_api_would_store_it(body):
    assert RewardSpec.model_validate(body).model_dump(mode="json") == body


def test_builtins_exist_and_reposting_one_is_no_new_version(client):
    for body in BUILTIN:
        got = client.get(f"/v1/reward-specs/{body['name']}").json()
        assert (got["version"], got["body"]) == (1, body)
        r = client.post("/v1/reward-specs", json=body)
        assert (r.status_code, r.json()) == (200, {"name": body["name"], "version": 1})


def _json_blocks(page: str) -> list[dict]:
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)```", (ROOT / page).read_text(), re.S)]


def test_the_integrations_score_example_gives_the_documented_answer(client):
    """docs/integrations.md: the POST /v1/score body with "math-r1" and the answer shown under it."""
    blocks = _json_blocks("docs/integrations.md")
    request = next(b for b in blocks if b.get("reward_spec") == "math-r1")
    documented = next(b for b in blocks if b.get("spec_name") == "math-r1")
    r = client.post("/v1/score", json=request)
    assert r.status_code == 200, r.text
    got = r.json()
    for result in got["results"]:
        for reward in result["rewards"].values():
            reward.pop("latency_ms", None)
    assert got == documented


@pytest.mark.parametrize(("completion", "total", "outcome"), [
    ("<think>6 * 7 = 42</think><answer>42</answer>", 1.5, 1.0),
    ("<think>so 7</think><answer>41</answer>", 0.5, 0.0),  # formatted, wrong
    (r"The answer is \boxed{42}", 1.0, 1.0),  # right, no <answer>: the format part is 0
    (r"<answer>\boxed{42}", 1.0, 1.0),  # unclosed: math-verify reads the whole text; format fails
    ("<answer>42", 0.0, 0.0),  # ... which holds no answer it can find here
])
def test_math_r1_scores(client, completion, total, outcome):
    r = client.post("/v1/score", json={"reward_spec": "math-r1", "items": [
        {"prompt": "What is 6 * 7?", "completion": completion, "reference": {"answer": "42"}}]})
    assert r.status_code == 200, r.text
    result = r.json()["results"][0]
    assert (result["total"], result["outcome"]) == (total, outcome)


def test_agent_tools_scores_tool_calls(client):
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
    completion = [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expression": "6*7"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "assistant", "content": "42"},
    ]
    r = client.post("/v1/score", json={"reward_spec": "agent-tools", "items": [
        {"prompt": "6*7?", "completion": completion, "tools": tools, "reference": {"answer": "42"}, "metadata": {}}]})
    assert r.status_code == 200, r.text
    rewards = r.json()["results"][0]["rewards"]
    assert rewards["correct"]["value"] == 1.0 and rewards["repetition"]["value"] == 0.0
    assert rewards["tool_calls"]["error"] or rewards["tool_calls"]["value"] is not None


def _names(url: str) -> dict[str, list[int]]:
    engine = sa.create_engine(to_sqlalchemy_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT name, version FROM reward_specs ORDER BY name, version")).all()
    finally:
        engine.dispose()
    out: dict[str, list[int]] = {}
    for name, version in rows:
        out.setdefault(name, []).append(version)
    return out


def test_downgrade_removes_only_untouched_builtins_and_upgrade_keeps_a_deployments_own(make_db):
    url = make_db()
    names = {b["name"] for b in BUILTIN}
    assert names <= set(_names(url))
    downgrade(url, "0009a")
    assert not names & set(_names(url))
    engine = sa.create_engine(to_sqlalchemy_url(url))
    with engine.begin() as conn:  # a deployment's own math-r1, defined before the upgrade
        conn.execute(sa.text("INSERT INTO reward_specs (name, version, body, body_hash) VALUES "
                             "('math-r1', 1, '{\"name\": \"math-r1\", \"components\": []}', 'mine')"))
    engine.dispose()
    upgrade(url)
    assert _names(url)["math-r1"] == [1]
    engine = sa.create_engine(to_sqlalchemy_url(url))
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT body_hash FROM reward_specs WHERE name = 'math-r1'")).scalar() == "mine"
    engine.dispose()
    downgrade(url, "0009a")  # not the built-in body: kept
    assert _names(url)["math-r1"] == [1] and "code-tests" not in _names(url)
