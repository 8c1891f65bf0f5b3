"""rule.tool_calls and rule.repetition."""

from __future__ import annotations

import pytest

from reward_models import make_component
from reward_models.agent_rules import repeated_ngram_fraction
from tests.reward_models.helpers import agent_sample, make_prompt, make_sample, tool_call

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "k": {"type": "integer", "minimum": 1}},
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "finish", "parameters": {"type": "object"}}},
]


def tool_score(calls: list[dict], **params: object):
    component = make_component("rule.tool_calls", {"tools": TOOLS, **params})
    return component.score(agent_sample(calls), make_prompt())


def test_all_valid_calls() -> None:
    result = tool_score([tool_call("search", {"query": "grpo", "k": 3}), tool_call("finish", {})])
    assert result.value == 1.0
    assert result.details == {"calls": 2, "valid": 2, "errors": []}


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (tool_call("search", '{"query": "grpo"'), "arguments are not JSON"),
        (tool_call("search", "[1, 2]"), "not a JSON object"),
        (tool_call("browse", {"url": "x"}), "unknown tool 'browse'"),
        (tool_call("search", {"k": 3}), "'query' is a required property"),
        (tool_call("search", {"query": "q", "k": 0}), "less than the minimum"),
        (tool_call("search", {"query": "q", "extra": 1}), "Additional properties"),
        ({"id": "c9", "type": "function"}, "malformed tool call"),
    ],
)
def test_invalid_call_is_counted_with_its_reason(call: dict, error: str) -> None:
    result = tool_score([tool_call("finish", {}), call])
    assert result.value == 0.5
    assert result.details["valid"] == 1
    assert result.details["errors"][0]["index"] == 1
    assert error in result.details["errors"][0]["error"]


def test_all_mode_is_binary() -> None:
    calls = [tool_call("finish", {}), tool_call("nope", {})]
    assert tool_score(calls, mode="all").value == 0.0
    assert tool_score(calls[:1], mode="all").value == 1.0


def test_no_calls_value() -> None:
    assert tool_score([]).value == 1.0
    assert tool_score([], no_calls_value=0.0).value == 0.0


def test_tools_from_prompt_metadata() -> None:
    component = make_component("rule.tool_calls", {})
    sample = agent_sample([tool_call("search", {"query": "x"})])
    assert component.score(sample, make_prompt(metadata={"tools": TOOLS})).value == 1.0
    missing = component.score(sample, make_prompt())
    assert missing.value is None and "no tool definitions" in (missing.error or "")
    broken = component.score(
        sample, make_prompt(metadata={"tools": [{"function": {"name": "s", "parameters": {"type": 3}}}]})
    )
    assert broken.value is None and "invalid parameters schema" in (broken.error or "")


def test_invalid_tool_schema_in_params_is_rejected() -> None:
    with pytest.raises(ValueError, match="param 'tools'.*invalid parameters schema"):
        make_component("rule.tool_calls", {"tools": [{"name": "x", "parameters": {"type": "nope"}}]})


@pytest.mark.parametrize(
    ("tokens", "n", "fraction"),
    [
        (["a", "b", "c", "d"], 2, 0.0),
        (["a", "b", "a", "b", "a", "b"], 2, 1 - 2 / 5),  # ab ba ab ba ab -> 2 distinct of 5
        (["a"] * 10, 3, 1 - 1 / 8),
        (["a", "b"], 3, 0.0),  # no trigram at all
        ([], 1, 0.0),
    ],
)
def test_repeated_ngram_fraction(tokens: list[str], n: int, fraction: float) -> None:
    assert repeated_ngram_fraction(tokens, n) == pytest.approx(fraction)


def test_normal_text_is_not_penalised_and_a_loop_is() -> None:
    component = make_component("rule.repetition", {})
    prose = (
        "Let x be the number of apples. Then 3x + 2 = 11, so 3x = 9 and x = 3. "
        "Checking: 3 * 3 + 2 = 11, which matches. The answer is 3."
    )
    looped = prose + " I need to check again." * 60
    assert component.score(make_sample(prose), make_prompt()).value == 0.0
    result = component.score(make_sample(looped), make_prompt())
    assert result.value is not None and result.value < -0.8
    assert result.details["repeated_ngram_fraction"] > 0.8


def test_identical_tool_calls_are_a_loop() -> None:
    component = make_component("rule.repetition", {"max_identical_calls": 3})
    same = [tool_call("search", {"query": "x", "k": 1}, f"c{i}") for i in range(3)]
    reordered = tool_call("search", '{"k": 1, "query": "x"}', "c9")  # same call, keys in another order
    varied = [tool_call("search", {"query": f"x{i}"}, f"c{i}") for i in range(5)]
    loop = component.score(agent_sample([*same[:2], reordered]), make_prompt())
    assert loop.value == -1.0 and loop.details["loop"] is True
    assert component.score(agent_sample(varied), make_prompt()).value == 0.0
    assert component.score(agent_sample(same[:2]), make_prompt()).value == 0.0


# --- hostile arguments: an invalid call (the model's mistake), never an error (docs/components.md) ---


def _nested(depth: int) -> dict:
    value: dict = {"query": "x"}
    for _ in range(depth):
        value = {"query": value}
    return value


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ("[" * 5000 + "]" * 5000, "nested too deeply"),
        ('{"query":' * 5000 + '"x"' + "}" * 5000, "nested too deeply"),
        ('{"query": "q", "k": %s}' % ("9" * 5000), "arguments are not JSON"),  # over 4,300 digits
        ('{"query": "q", "k": NaN}', "NaN is not JSON"),  # NaN passes every minimum
        ('{"query": ' * 150 + '"x"' + "}" * 150, "nested deeper than 100"),
        (_nested(5000), "nested too deeply"),  # already-parsed arguments (a library caller)
    ],
)
def test_hostile_arguments_are_an_invalid_call_and_the_valid_one_still_counts(arguments: object, error: str) -> None:
    call = {"id": "c2", "type": "function", "function": {"name": "search", "arguments": arguments}}
    result = tool_score([tool_call("finish", {}), call])
    assert result.error is None, result.error
    assert result.value == 0.5
    assert result.details["errors"][0]["index"] == 1
    assert error in result.details["errors"][0]["error"]


def test_arguments_that_break_the_validator_are_an_invalid_call() -> None:
    tools = [{"type": "function", "function": {"name": "pay", "parameters": {
        "type": "object", "properties": {"amount": {"type": "number", "multipleOf": 0.5}}}}}]
    component = make_component("rule.tool_calls", {"tools": tools})
    big = tool_call("pay", '{"amount": 1%s}' % ("0" * 400))  # parses; int / 0.5 overflows a float
    result = component.score(agent_sample([tool_call("pay", {"amount": 1.5}), big]), make_prompt())
    assert result.error is None, result.error
    assert result.value == 0.5
    assert "could not be validated" in result.details["errors"][0]["error"]


@pytest.mark.parametrize(
    "made",
    ["abc", 5, {"a": 1}, [5], [None], [{"function": "x"}], [{"function": {"name": ["search"]}}]],
)
def test_tool_calls_of_the_wrong_shape_are_malformed_calls(made: object) -> None:
    sample = make_sample("done", messages=[{"role": "assistant", "content": "", "tool_calls": made},
                                           {"role": "assistant", "content": "done"}])
    tool_rule = make_component("rule.tool_calls", {"tools": TOOLS}).score(sample, make_prompt())
    assert tool_rule.error is None and tool_rule.value == 0.0
    assert all("malformed" in e["error"] for e in tool_rule.details["errors"])
    repetition = make_component("rule.repetition", {}).score(sample, make_prompt())
    assert repetition.error is None and repetition.value == 0.0


@pytest.mark.parametrize(
    "arguments",
    ["[" * 5000 + "]" * 5000, '{"query": %s}' % ("9" * 5000), _nested(5000), {"query": 10**5000}],
)
def test_repetition_reads_hostile_arguments_and_still_sees_their_loop(arguments: object) -> None:
    component = make_component("rule.repetition", {"max_identical_calls": 3})
    call = {"id": "c", "type": "function", "function": {"name": "search", "arguments": arguments}}
    once = component.score(agent_sample([call]), make_prompt())
    assert once.error is None and once.value == 0.0
    thrice = component.score(agent_sample([call] * 3), make_prompt())
    assert thrice.error is None
    # the same unparseable text three times is a loop; arguments JSON cannot write have no identity
    assert thrice.details["loop"] is isinstance(arguments, str)


REDOS_TOOLS = [{"type": "function", "function": {"name": "tag", "parameters": {
    "type": "object", "properties": {"label": {"type": "string", "pattern": "^(a+)+$"}}}}}]


def test_a_backtracking_tool_schema_is_validated_under_the_deadline() -> None:
    """A tool schema with a ``pattern`` (Python's backtracking ``re``): the model's arguments could hold
    the scoring worker for hours inline; in the pool the timeout rule fails that call's sample (0)."""
    from reward_models.scoring import Scorer
    from reward_models.spec import RewardSpec

    evil = agent_sample([tool_call("tag", {"label": "a" * 40 + "!"})])
    fine = agent_sample([tool_call("tag", {"label": "aaaa"})])
    no_calls = make_sample("done")
    component = make_component("rule.tool_calls", {"tools": REDOS_TOOLS})
    assert component.in_pool(evil, make_prompt()) and not component.in_pool(no_calls, make_prompt())
    from_prompt = make_component("rule.tool_calls", {})
    prompt = make_prompt(metadata={"tools": REDOS_TOOLS})
    assert from_prompt.in_pool(evil, prompt) and not from_prompt.in_pool(evil, make_prompt(metadata={"tools": TOOLS}))
    spec = RewardSpec(name="t", components=[{"name": "tools", "kind": "rule.tool_calls", "params": {"tools": REDOS_TOOLS}}])
    with Scorer(processes=1, timeout_s=2.0) as scorer:
        evil_scored, fine_scored = scorer.score(spec, [(evil, make_prompt()), (fine, make_prompt())])
    evil_result = evil_scored.components["tools"]
    assert evil_result.error is None and evil_result.value == 0.0
    assert evil_result.details["reason"] == "verification_timeout"
    assert fine_scored.components["tools"].value == 1.0
