"""verl / OpenRLHF / TRL adapters against a live service, called the way each trainer calls them."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from grpo_curator_integrations import openrlhf, trl, verl
from grpo_curator_integrations._http import ScoringError
from tests.conftest import ROOT, LiveServer

GOOD, BAD = "<answer>42</answer>", "<answer>41</answer>"


def test_adapters_import_without_torch_or_server_packages() -> None:
    code = ("import sys\nfor m in ('torch', 'fastapi', 'sqlalchemy', 'uvicorn', 'transformers'): sys.modules[m] = None\n"
            "import grpo_curator_integrations.trl, grpo_curator_integrations.verl, grpo_curator_integrations.openrlhf\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_verl_compute_score_with_verls_argument_names(service: LiveServer) -> None:
    kw = {"spec": "integ", "url": service.url}
    good = verl.compute_score(data_source="gsm8k", solution_str=GOOD, ground_truth="42",
                              extra_info={"split": "train", "index": 3}, **kw)
    assert good == {"score": 1.5, "correct": 1.0, "fmt": 1.0}
    assert verl.compute_score("gsm8k", "41", "42", **kw) == {"score": 0.0, "correct": 0.0, "fmt": 0.0}
    batch = verl.compute_score_batch(data_sources=["a", "b", "c"], solution_strs=[GOOD, BAD, "42"],
                                     ground_truths=["42", "42", "42"], extra_infos=[None, {}, {"i": 1}], **kw)
    assert [b["score"] for b in batch] == [1.5, 0.5, 1.0]


def test_verl_error_raises_or_is_flagged(service: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_CURATOR_URL", service.url)
    monkeypatch.setenv("GRPO_CURATOR_REWARD_SPEC", "integ")
    with pytest.raises(ScoringError, match="no 'answer'"):
        verl.compute_score("gsm8k", GOOD, None)
    flagged = verl.compute_score("gsm8k", GOOD, None, on_error=-1.0)
    assert flagged == {"score": -1.0, "correct": -1.0, "fmt": 1.0, "reward_error": 1.0}
    assert verl.compute_score("gsm8k", GOOD, "42", on_error=-1.0)["reward_error"] == 0.0
    with pytest.raises(ScoringError, match="422 reward_spec: no reward spec .nope."):
        verl.compute_score("gsm8k", GOOD, "42", spec="nope")


def test_python_function_runs_in_the_killable_pool(service: LiveServer) -> None:
    httpx.post(f"{service.url}/v1/reward-specs", json={"name": "fn", "components": [
        {"name": "user", "kind": "python.function", "params": {"name": "mine"}},
        {"name": "slow", "kind": "python.function", "params": {"name": "hang"}}]}).raise_for_status()
    r = httpx.post(f"{service.url}/v1/score", timeout=60, json={"reward_spec": "fn", "items": [
        {"prompt": "", "completion": "x 42", "reference": {"answer": "42"}, "dataset": "gsm8k"},
        {"prompt": "", "completion": "hang 42", "reference": {"answer": "42"}}]}).json()
    ok, hung = r["results"]
    assert ok["total"] == 2.0 and ok["rewards"]["user"]["details"] == {"source": "gsm8k"}
    # the function hung on this answer while it answers its canary in time: the answer fails (0), the
    # verifier is healthy, so the sample is still scored (docs/limits.md, the timeout rule)
    slow = hung["rewards"]["slow"]
    assert slow["value"] == 0.0 and slow["error"] is None and slow["details"]["reason"] == "verification_timeout"
    assert hung["total"] == 1.0 and hung["rewards"]["user"]["value"] == 1.0
    bad = httpx.post(f"{service.url}/v1/reward-specs", json={"name": "fn2", "components": [
        {"name": "user", "kind": "python.function", "params": {"name": "/tmp/evil.py"}}]})
    assert bad.status_code == 422 and "not an allowed function" in bad.json()["error"]


def test_openrlhf_reward_func(service: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("GRPO_CURATOR_URL", service.url)
    monkeypatch.setenv("GRPO_CURATOR_REWARD_SPEC", "integ")
    prompts = ["<s>[INST] 6*7? [/INST]"] * 2
    out = openrlhf.reward_func([p + r + "</s>" for p, r in zip(prompts, [GOOD, "42"], strict=True)], prompts, ["42", "42"])
    assert torch.equal(out["rewards"], torch.tensor([1.5, 1.0]))
    assert torch.equal(out["extra_logs"]["fmt"], torch.tensor([1.0, 0.0]))
    with pytest.raises(ScoringError, match="503"):  # the service's default: an unscorable item fails loudly
        openrlhf.reward_func([prompts[0] + GOOD], prompts[:1], [None])


def test_adapters_learn_the_services_item_limit_from_its_413(service: LiveServer) -> None:
    from tests.integrations.conftest import MAX_SCORE_ITEMS

    n = 2 * MAX_SCORE_ITEMS + 3  # the adapters start with 256 items per request
    over = httpx.post(f"{service.url}/v1/score", json={"reward_spec": "integ", "items": [
        {"prompt": "q", "completion": GOOD}] * (MAX_SCORE_ITEMS + 1)})
    assert over.status_code == 413 and over.json()["detail"]["max_items"] == MAX_SCORE_ITEMS
    answers = [GOOD, BAD, "42"] * n
    batch = verl.compute_score_batch(["a"] * len(answers), answers, ["42"] * len(answers),
                                     spec="integ", url=service.url)
    assert [b["score"] for b in batch] == [1.5, 0.5, 1.0] * n
    correct, fmt = trl.reward_funcs("integ", url=service.url)[0]
    assert fmt(prompts=["q"] * len(answers), completions=answers, answer=["42"] * len(answers)) == [1.0, 1.0, 0.0] * n
    torch = pytest.importorskip("torch")
    prompts = ["<s>[INST] 6*7? [/INST]"] * len(answers)
    out = openrlhf.reward_func([p + a + "</s>" for p, a in zip(prompts, answers, strict=True)], prompts,
                               ["42"] * len(answers), url=service.url, spec="integ")
    assert torch.equal(out["rewards"], torch.tensor([1.5, 0.5, 1.0] * n))
    assert torch.equal(out["extra_logs"]["correct"], torch.tensor([1.0, 0.0, 1.0] * n))
    assert len(out["extra_logs"]["truncated"]) == len(answers)


def test_trl_reward_funcs_named_weighted_and_none_on_error(service: LiveServer) -> None:
    funcs, weights = trl.reward_funcs("integ", url=service.url)
    assert [f.__name__ for f in funcs] == ["correct", "fmt"] and weights == [1.0, 0.5]
    correct, fmt = funcs
    prompts, completions = ["q1", "q2", "q3"], [GOOD, "42", GOOD]
    assert correct(prompts, completions, [[1, 2]] * 3, answer=["42", "42", None]) == [1.0, 1.0, None]
    # all or nothing (default): the row without a total is None from every function, so TRL masks it
    assert fmt(prompts, completions, [[1, 2]] * 3, answer=["42", "42", None]) == [1.0, 0.0, None]
    _, loose_fmt = trl.reward_funcs("integ", url=service.url, all_or_nothing=False)[0]
    assert loose_fmt(prompts, completions, [[1, 2]] * 3, answer=["42", "42", None]) == [1.0, 0.0, 1.0]
    assert correct(prompts, completions, None, solution=["41", "42", "42"]) == [0.0, 1.0, 1.0]
    assert correct(prompts, completions, None, ground_truth=[{"answer": "42"}] * 3) == [1.0, 1.0, 1.0]
    assert correct(prompts, completions, None, trainer_state=None) == [None, None, None]  # no reference column
    chat = [[{"role": "assistant", "content": GOOD}]] * 3
    assert correct([[{"role": "user", "content": "q"}]] * 3, chat, None, answer=["42"] * 3) == [1.0] * 3
    pinned, _ = trl.reward_funcs("integ@1", url=service.url, reference_column="gold")
    assert pinned[0](prompts, completions, None, gold=["42"] * 3) == [1.0, 1.0, 1.0]
    with pytest.raises(KeyError, match="gold"):
        pinned[0](prompts, completions, None, answer=["42"] * 3)


# --- 5. TRL adapter: functions and weights from one spec version, scoring by another -----------------------
# Attack: the TRL adapter took its functions and weights from one spec version and scored with another.

def test_trl_reward_funcs_keep_scoring_with_the_version_their_weights_came_from(service: LiveServer) -> None:
    from grpo_curator_integrations import trl

    v1 = {"name": "drift", "components": [
        {"name": "correct", "kind": "verifier.exact_match", "outcome": True, "params": {"extract_pattern": "(\\d+)"}},
        {"name": "fmt", "kind": "rule.format", "weight": 0.5, "params": {"required_tags": ["answer"]}}]}
    assert httpx.post(f"{service.url}/v1/reward-specs", json=v1).status_code == 201
    funcs, weights = trl.reward_funcs("drift", url=service.url)
    assert [f.__name__ for f in funcs] == ["correct", "fmt"] and weights == [1.0, 0.5]
    # mid-run, someone publishes version 2 of the spec (a component renamed)
    v2 = {**v1, "components": [v1["components"][0], {**v1["components"][1], "name": "format"}]}
    assert httpx.post(f"{service.url}/v1/reward-specs", json=v2).status_code == 201
    prompts, completions = ["What is 6*7?"], ["<answer>42</answer>"]
    # today: the unpinned name resolves to v2 at scoring time -> KeyError 'fmt' inside TRL's reward loop
    # (and with the same names but new weights/params, TRL would mix v2 values with v1 weights silently)
    assert [f(prompts=prompts, completions=completions, answer=["42"]) for f in funcs] == [[1.0], [1.0]]


def test_the_old_package_name_still_imports_with_a_deprecation_warning() -> None:
    code = ("import warnings\nwarnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    import integrations.verl\nexcept DeprecationWarning as e:\n    print('warned', e)\n"
            "warnings.simplefilter('ignore')\nimport integrations.verl, integrations._http, grpo_curator_integrations.verl as v\n"
            "print(integrations.verl.compute_score is v.compute_score, integrations._http.ScoringError.__module__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("warned") and "grpo_curator_integrations" in lines[0], out.stderr
    assert lines[1] == "True grpo_curator_integrations._http"


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALLED = [{"role": "assistant", "content": "", "tool_calls": [
              {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
          {"role": "tool", "tool_call_id": "c1", "content": "sunny"}, {"role": "assistant", "content": "sunny"}]


def test_adapters_pass_the_prompts_tools_to_the_builtin_agent_spec(service: LiveServer) -> None:
    """A ``tools`` dataset column (TRL) or ``extra_info["tools"]`` (verl), a list or its JSON text, reaches
    ``rule.tool_calls``; without it the component names what is missing."""
    import json

    funcs, _ = trl.reward_funcs("agent-tools", url=service.url)
    tool_calls = funcs[[f.__name__ for f in funcs].index("tool_calls")]
    prompts = [[{"role": "user", "content": "Weather in Paris?"}]] * 2
    assert tool_calls(prompts, [CALLED] * 2, None, answer=["sunny"] * 2, tools=[TOOLS, json.dumps(TOOLS)]) == [1.0, 1.0]
    assert tool_calls(prompts, [CALLED] * 2, None, answer=["sunny"] * 2) == [None, None]
    # verl passes the response as text (no tool_calls messages): the tools still travel with the item
    assert verl._item("agent", "sunny", "sunny", {"prompt": "q", "tools": json.dumps(TOOLS)})["tools"] == TOOLS
    assert "tools" not in verl._item("agent", "sunny", "sunny", {"prompt": "q", "tools": "not json"})
