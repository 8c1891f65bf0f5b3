"""The one rule for every reward component (docs/components.md, "Low score or error"): whatever the model
writes may make a component score low, never error. Every registered kind is scored, through the Scorer
(inline or in the killable pool, as in the worker), on a corpus of hostile model output; each result must
be a finite number without an error. A newly registered kind fails ``test_every_registered_kind_is_attacked``
until it has params here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from reward_models.base import PromptInfo, Sample
from reward_models.external import PYTHON_FUNCTIONS_ENV
from reward_models.llm_judge import JudgeEndpoint
from reward_models.registry import KINDS
from reward_models.scoring import Scorer
from reward_models.spec import ComponentSpec, RewardSpec
from tests.reward_models.conftest import FakeOpenAIServer
from tests.reward_models.test_reward_model import TINY_LLAMA

# verifier.code runs the model's program in the sandbox; its hostile programs and outputs are covered by
# tests/reward_models/test_code_attacks.py, test_code_harness.py, test_sandbox_limits.py (the sandbox's own suite)
COVERED_ELSEWHERE = {"verifier.code"}
# python.function reads its allowlist from the environment, which the pool's forkserver (started by an
# earlier test) does not share with this test's monkeypatch: scored here, in this process
SCORED_IN_PROCESS = {"python.function"}

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "number", "multipleOf": 0.5}}}}}]
SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}}

PARAMS: dict[str, list[dict]] = {
    "rule.format": [{"required_tags": ["think", "answer"], "source": "response"}, {"pattern": r"Answer: (\d+)"}],
    "rule.tool_calls": [{"tools": TOOLS}, {}],  # {}: the prompt's tools
    "rule.repetition": [{}, {"unit": "char", "source": "final_answer"}],
    "rule.length": [{"target": 10, "limit": 100, "unit": "words"}, {"target": 10, "limit": 100, "unit": "chars"}],
    "rule.overlong": [{"max_tokens": 100, "buffer": 10}],
    "rule.turns": [{"max_turns": 5}],
    "verifier.math": [{}],
    "verifier.exact_match": [{}, {"extract_pattern": r"Answer: (\d+)"}],
    "verifier.f1": [{}],
    "verifier.json_schema": [{}],
    "judge.llm": [{"endpoint": "judge", "model": "m"}, {"endpoint": "judge", "model": "m", "response": "transcript"}],
    "judge.reward_model": [{"config": TINY_LLAMA, "device": "cpu"},
                           {"config": TINY_LLAMA, "device": "cpu", "response": "transcript"}],
    "external.reported": [{}],
    "python.function": [{"name": "exact"}],
}

USER_FUNCTION = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
                "    return float(solution_str.strip() == str(ground_truth))\n"


def _nested(depth: int) -> dict:
    value: dict = {"q": "x"}
    for _ in range(depth):
        value = {"q": value}
    return value


DEEP = 5000
HOSTILE_TEXTS = {
    "deep_json_array": "[" * DEEP + "]" * DEEP,
    "deep_json_object": '{"q":' * DEEP + "1" + "}" * DEEP,
    "json_nested_150": '{"q":' * 150 + "1" + "}" * 150,  # parses, but deeper than the validators go
    "huge_int": "9" * DEEP,
    "huge_int_in_json": '{"q": %s}' % ("9" * DEEP),
    "big_int_vs_multipleOf": '{"n": %s}' % ("9" * 400),  # parses; int / 0.5 overflows a float
    "nan_json": '{"q": NaN}',
    "nul": "Answer: 4\x002 <think>\x00</think>",
    "lone_surrogates": "Answer: \ud800 42 \udfff",
    "odd_unicode": "\u202e\ufeff\u0301\U0010ffff" * 50 + "Answer: 42",
    "huge_text": "word " * 40_000,
    "deep_frac": "$" + "\\frac{" * 3000 + "1" + "}{2}" * 3000 + "$",
    "deep_boxed_parens": "\\boxed{" + "(" * 3000 + "1" + ")" * 3000 + "}",
    "power_tower": r"$\boxed{9^{9^{9^{9}}}}$",
    "many_open_fences": "```json\n" * 2000,
}
ODD_PARTS = [{"type": "text", "text": 5}, {"type": "text", "text": None}, {"type": "text", "text": ["a"]},
             {"type": "text", "text": {"a": 1}}, {"type": "text"}, "a bare string", 7, None,
             {"type": "image_url", "image_url": {"url": "x"}}]
ODD_ARGUMENTS = [{"q": 1}, ["a"], 5, None, True, {"n": 10**400}, {"n": 10**5000}, _nested(200), {"q": float("nan")}]
ODD_TOOL_CALLS = ["abc", {"a": 1}, 5, [5], [None], [{"function": "x"}], [{"function": {"name": 5}}],
                  [{"function": {"name": ["search"], "arguments": "{}"}}]]


def _sample(messages: list, final_answer: str = "x") -> Sample:
    return Sample(messages=messages, final_answer=final_answer, finish_reason="stop", num_tokens=5,
                  num_turns=max(len(messages), 1), metadata={"reward": 0.5})


def _call(arguments: object, name: object = "search") -> dict:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


def hostile_cases() -> list[tuple[str, Sample]]:
    """(name, sample): hostile text as the answer, as string content and as a text part, and as tool-call
    arguments; content parts whose text is not a string; tool calls of every wrong shape."""
    cases = []
    for name, text in HOSTILE_TEXTS.items():
        cases.append((name, _sample([{"role": "assistant", "content": text}], text)))
        cases.append((f"{name}/part", _sample([{"role": "assistant", "content": [{"type": "text", "text": text}]}])))
        calls = [_call(text), _call('{"q": "ok"}'), _call(text)]
        cases.append((f"{name}/arguments", _sample([{"role": "assistant", "content": "", "tool_calls": calls}])))
    cases.append(("odd_parts", _sample([{"role": "assistant", "content": ODD_PARTS}])))
    cases += [(f"odd_part[{i}]", _sample([{"role": "assistant", "content": [p]}])) for i, p in enumerate(ODD_PARTS)]
    cases += [(f"content={c!r}", _sample([{"role": "assistant", "content": c}])) for c in (5, 1.5, True, {"a": 1})]
    cases += [(f"arguments[{i}]", _sample([{"role": "assistant", "content": "", "tool_calls": [_call(a)] * 3}]))
              for i, a in enumerate(ODD_ARGUMENTS)]
    cases += [(f"tool_calls[{i}]", _sample([{"role": "assistant", "content": "", "tool_calls": tc}]))
              for i, tc in enumerate(ODD_TOOL_CALLS)]
    cases.append(("messages_not_objects", _sample(["hello", None, 5, ["x"]])))
    cases.append(("odd_roles", _sample([{"role": 5, "content": "x"}, {"content": "y"}, {"role": None}])))
    cases.append(("no_messages", _sample([], "")))
    return cases


PROMPT = PromptInfo(messages=[{"role": "user", "content": "What is 6 * 7?"}],
                    reference={"answer": "42", "schema": SCHEMA}, metadata={"tools": TOOLS}, dataset="hostile")


def test_every_registered_kind_is_attacked() -> None:
    assert set(KINDS) - COVERED_ELSEWHERE == set(PARAMS), "give a new kind its params in PARAMS"


@pytest.fixture
def user_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "exact.py"
    path.write_text(USER_FUNCTION)
    monkeypatch.setenv(PYTHON_FUNCTIONS_ENV, json.dumps({"exact": str(path)}))


@pytest.mark.parametrize("kind", sorted(PARAMS))
def test_hostile_model_output_scores_a_number_never_an_error(kind: str, request: pytest.FixtureRequest) -> None:
    endpoints = {}
    if kind == "judge.llm":
        server: FakeOpenAIServer = request.getfixturevalue("fake_judge")
        endpoints = {"judge": JudgeEndpoint(url=server.base_url, max_retries=0)}
    if kind == "python.function":
        request.getfixturevalue("user_function")
    cases = hostile_cases()
    failures = {}
    for params in PARAMS[kind]:
        spec = RewardSpec(name="hostile", components=[ComponentSpec(name="c", kind=kind, params=params)])
        # a short deadline: an answer that makes verification slow is failed by the timeout rule
        with Scorer(processes=2, timeout_s=5.0, judge_endpoints=endpoints) as scorer:
            if kind in SCORED_IN_PROCESS:
                component = scorer.component(kind, params)
                results = [component.score(sample, PROMPT) for _, sample in cases]
            else:
                results = [s.components["c"] for s in scorer.score(spec, [(sample, PROMPT) for _, sample in cases])]
        for (name, _), r in zip(cases, results, strict=True):
            if r.error is not None or r.value is None or not math.isfinite(r.value):
                failures[f"{json.dumps(params)[:60]} {name}"] = r.error or r.value
    assert not failures, failures
