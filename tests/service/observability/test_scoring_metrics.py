"""Component metrics count every scoring path: the worker, POST /v1/score and the OpenRLHF route, each under
its ``path`` label; a component that has not failed has an error series at 0, so an error rate reads 0."""

from __future__ import annotations

import re
import uuid

import pytest

from service.observability.metrics import observe_components

RESULTS = "grpo_curator_component_results_total"
LATENCY = "grpo_curator_component_latency_seconds_count"


def _sum(text: str, name: str, **labels: str) -> float:
    """The sum of every ``name`` sample whose labels include ``labels`` (None when there is none)."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
        if all(got.get(k) == v for k, v in labels.items()):
            total, found = total + float(line.rsplit(" ", 1)[1]), True
    return total if found else None


@pytest.fixture
def spec(client) -> tuple[str, str, str]:
    tag = uuid.uuid4().hex[:8]
    name, ok, bad = f"met-{tag}", f"ok-{tag}", f"bad-{tag}"  # names no other test uses: the counters are process-wide
    r = client.post("/v1/reward-specs", json={"name": name, "components": [
        {"name": ok, "kind": "verifier.math", "outcome": True},
        {"name": bad, "kind": "external.reported", "weight": 0.0, "params": {"key": "env"}},  # no metadata.env: error
    ]})
    assert r.status_code == 201, r.text
    return name, ok, bad


def test_v1_score_is_counted_under_path_score(client, spec):
    name, ok, bad = spec
    r = client.post("/v1/score", json={"reward_spec": name, "items": [
        {"prompt": "6*7?", "completion": a, "reference": {"answer": "42"}} for a in (r"\boxed{42}", r"\boxed{41}", "x")]})
    assert r.status_code == 200, r.text
    text = client.get("/metrics").text
    assert _sum(text, RESULTS, component=ok, result="ok", path="score") == 3
    assert _sum(text, RESULTS, component=ok, result="error", path="score") == 0  # present, at 0: a rate of 0
    assert _sum(text, RESULTS, component=bad, result="error", path="score") == 3
    assert _sum(text, LATENCY, component=ok, kind="verifier.math", path="score") == 3
    assert _sum(text, RESULTS, component=ok, path="worker") is None  # nothing ran through the worker


def test_openrlhf_route_is_counted_under_path_openrlhf(client, spec, monkeypatch):
    name, ok, bad = spec
    monkeypatch.setattr(client.app.state.settings, "openrlhf_on_error", "value")  # the errored component: a value
    prompt = "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n"
    body = {"query": [prompt + r"\boxed{42}<|im_end|>", prompt + r"\boxed{1}<|im_end|>"], "prompts": [prompt] * 2,
            "labels": ["42", "42"]}
    r = client.post(f"/compat/openrlhf/{name}/get_reward", json=body)
    assert r.status_code == 200, r.text
    text = client.get("/metrics").text
    assert _sum(text, RESULTS, component=ok, result="ok", path="openrlhf") == 2
    assert _sum(text, RESULTS, component=bad, result="error", path="openrlhf") == 2
    assert _sum(text, RESULTS, component=ok, path="score") is None


def test_an_unknown_path_is_refused():
    with pytest.raises(ValueError, match="path"):
        observe_components({}, [], path="elsewhere")
