"""verifier.code through the API: sandbox switches are not spec params; attacks score 0 end to end."""

from __future__ import annotations

import pytest

from service.worker.pipeline import drain
from tests.helpers import make_group

CODE_SPEC = {"name": "code", "components": [{"name": "tests", "kind": "verifier.code", "outcome": True}]}
REFERENCE = {
    "tests": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(0, 0) == 0\n",
    "entry_point": "add",
}


@pytest.mark.parametrize("param", ["allow_network", "allow_subprocess", "backend"])
def test_spec_asking_for_a_sandbox_switch_is_rejected_naming_it(api, param):
    body = {
        "name": "weak",
        "components": [{"name": "tests", "kind": "verifier.code", "params": {param: True}}],
    }
    r = api.post("/v1/reward-specs", json=body)
    assert r.status_code == 422, r.text
    assert param in r.text and f"GRPO_CURATOR_SANDBOX_{param.upper()}" in r.text
    assert api.get("/v1/reward-specs/weak").status_code == 404  # nothing stored


def test_attacks_score_zero_and_a_solution_one_end_to_end(api, scorer):
    assert api.post("/v1/reward-specs", json=CODE_SPEC).status_code == 201
    assert api.put("/v1/datasets/code", json={"reward_spec": "code"}).status_code == 200
    answers = [
        "```python\ndef add(a, b):\n    return a + b\n```",
        "import sys\nsys.exit(0)\n",
        "class A:\n    def __eq__(self, o): return True\ndef add(a, b):\n    return A()\n",
        "import os, glob\ndef add(a, b):\n    return [open(p, 'rb').read() for p in glob.glob('/proc/*/environ')]\n",
    ]
    group = make_group("code-1", prompt_id="code-p", dataset="code", answers=answers, reference=REFERENCE)
    for trajectory, answer in zip(group["trajectories"], answers, strict=True):
        trajectory["messages"][-1]["content"] = answer  # the program is the whole final answer
    assert api.post("/v1/groups", json=group).status_code in (200, 201, 202)
    drain(api.factory, scorer)
    g = api.get("/v1/groups/code-1").json()
    rewards = [t["rewards"]["tests"] for t in sorted(g["trajectories"], key=lambda t: t["index"])]
    assert [r["value"] for r in rewards] == [1.0, 0.0, 0.0, 0.0], rewards
    assert all(r["error"] is None for r in rewards)
    assert all(r["details"]["isolation"] == "bubblewrap" for r in rewards)
    assert (
        "SystemExit" in rewards[1]["details"]["reason"]
        and "not plain data" in rewards[2]["details"]["reason"]
    )
