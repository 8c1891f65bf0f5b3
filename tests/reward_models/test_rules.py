"""rule.format, rule.length, rule.overlong, rule.turns."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reward_models import make_component
from reward_models.rules import soft_overlong_penalty
from tests.reward_models.helpers import make_prompt, make_sample

THINK_ANSWER = {"required_tags": ["think", "answer"]}


def fmt(answer: str, **params: object) -> float | None:
    return (
        make_component("rule.format", params or THINK_ANSWER).score(make_sample(answer), make_prompt()).value
    )


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ("<think>6*7</think><answer>42</answer>", 1.0),
        ("<think>6*7</think>\n<answer> 42 </answer>\n", 1.0),
        ("<think>6*7</think><answer></answer>", 0.0),  # perfect format, empty answer
        ("<think>6*7</think><answer>   \n</answer>", 0.0),
        ("42", 0.0),  # answer with no format
        ("<answer>42</answer><think>x</think>", 0.0),  # wrong order
        ("<think>a</think><answer>1</answer><answer>2</answer>", 0.0),  # answer twice
        ("<think>a</think></answer>42<answer>", 0.0),  # closed before opened
        ("<think>a<answer>42</answer>", 0.0),  # think never closed
    ],
)
def test_tag_format(answer: str, value: float) -> None:
    assert fmt(answer) == value


def test_tag_format_reports_what_failed() -> None:
    result = make_component("rule.format", THINK_ANSWER).score(
        make_sample("<think>x</think><answer></answer>"), make_prompt()
    )
    assert result.details["failed"] == ["<answer> is empty"]


def test_empty_tags_allowed_when_nonempty_is_off() -> None:
    assert fmt("<think></think><answer>42</answer>", required_tags=["think", "answer"]) == 0.0
    assert fmt("<think></think><answer>42</answer>", required_tags=["think", "answer"], nonempty=False) == 1.0


def test_regex_format_with_answer_group() -> None:
    boxed = r"\\boxed\{(?P<answer>[^}]*)\}"
    assert fmt(r"so \boxed{42}.", pattern=boxed) == 1.0
    assert fmt(r"so \boxed{}.", pattern=boxed) == 0.0  # matches, but the answer is empty
    assert fmt("so 42.", pattern=boxed) == 0.0
    assert fmt("Answer: 42", pattern=r"Answer: (\d+)", match="fullmatch") == 1.0
    assert fmt("Well. Answer: 42", pattern=r"Answer: (\d+)", match="fullmatch") == 0.0


def test_format_on_the_whole_response() -> None:
    sample = make_sample(
        "<answer>42</answer>",
        messages=[
            {"role": "assistant", "content": "<think>hmm</think>"},
            {"role": "assistant", "content": "<answer>42</answer>"},
        ],
    )
    component = make_component("rule.format", {**THINK_ANSWER, "source": "response"})
    assert component.score(sample, make_prompt()).value == 1.0
    assert make_component("rule.format", THINK_ANSWER).score(sample, make_prompt()).value == 0.0


def reference_overlong(length: int, l_max: int, l_cache: int) -> float:
    """DAPO eq. 13 written piece by piece."""
    if length <= l_max - l_cache:
        return 0.0
    if length <= l_max:
        return ((l_max - l_cache) - length) / l_cache
    return -1.0


@pytest.mark.parametrize(
    ("length", "value"),
    [
        (0, 0.0),
        (12_288, 0.0),
        (12_289, -1 / 4096),
        (14_336, -0.5),
        (16_384, -1.0),
        (16_385, -1.0),
        (99_999, -1.0),
    ],
)
def test_overlong_hand_values(length: int, value: float) -> None:
    component = make_component("rule.overlong", {"max_tokens": 16_384, "buffer": 4096})
    result = component.score(make_sample("x" if length else "", num_tokens=length), make_prompt())
    assert result.value == pytest.approx(value)
    assert result.details["length"] == length


@settings(deadline=None)  # a pure function: a slow example only means a busy machine
@given(st.integers(0, 3000), st.integers(1, 1000), st.integers(1, 1000))
def test_overlong_matches_reference_and_is_monotone(length: int, l_max: int, l_cache: int) -> None:
    l_cache = min(l_cache, l_max)
    value = soft_overlong_penalty(length, l_max, l_cache)
    assert value == pytest.approx(reference_overlong(length, l_max, l_cache))
    assert -1.0 <= value <= 0.0
    assert soft_overlong_penalty(length + 1, l_max, l_cache) <= value


def test_unknown_token_count_is_an_error_not_zero() -> None:
    component = make_component("rule.overlong", {"max_tokens": 100, "buffer": 10})
    result = component.score(make_sample("a long answer", num_tokens=0), make_prompt())
    assert result.value is None
    assert "num_tokens unknown" in (result.error or "")


@pytest.mark.parametrize(
    ("params", "sample_kwargs", "value"),
    [
        ({"target": 100, "limit": 200}, {"num_tokens": 100}, 0.0),
        ({"target": 100, "limit": 200}, {"num_tokens": 150}, -0.5),
        ({"target": 100, "limit": 200}, {"num_tokens": 500}, -1.0),
        ({"target": 2, "limit": 6, "unit": "words"}, {}, -0.5),  # "one two three four" = 4 words
        ({"target": 0, "limit": 36, "unit": "chars"}, {}, -0.5),  # 18 chars
    ],
)
def test_length_penalty(params: dict, sample_kwargs: dict, value: float) -> None:
    sample = make_sample("one two three four", **sample_kwargs)
    assert make_component("rule.length", params).score(sample, make_prompt()).value == pytest.approx(value)


@pytest.mark.parametrize(
    ("params", "turns", "value"),
    [
        ({"max_turns": 8}, 8, 0.0),
        ({"max_turns": 8}, 9, -1.0),
        ({"max_turns": 8, "buffer": 4}, 4, 0.0),
        ({"max_turns": 8, "buffer": 4}, 6, -0.5),
        ({"max_turns": 8, "buffer": 4}, 8, -1.0),
        ({"max_turns": 8, "buffer": 4}, 20, -1.0),
    ],
)
def test_turn_budget(params: dict, turns: int, value: float) -> None:
    result = make_component("rule.turns", params).score(make_sample("ok", num_turns=turns), make_prompt())
    assert result.value == pytest.approx(value)
    assert result.details == {"turns": turns}


# --- content the model shaped oddly: read as "no text", never an error (docs/components.md) ---

ODD_PARTS = [{"type": "text", "text": 5}, {"type": "text", "text": None}, {"type": "text", "text": ["<answer>"]},
             {"type": "text", "text": {"t": "<answer>"}}, {"type": "text"}, "a bare string", 7, None]


@pytest.mark.parametrize("part", ODD_PARTS)
def test_a_part_whose_text_is_not_a_string_is_no_text(part: object) -> None:
    content = [{"type": "text", "text": "<think>a</think>"}, part, {"type": "text", "text": "<answer>42</answer>"}]
    sample = make_sample("x", messages=[{"role": "assistant", "content": content}], num_tokens=3)
    fmt_rule = make_component("rule.format", {**THINK_ANSWER, "source": "response"})
    assert fmt_rule.score(sample, make_prompt()).value == 1.0  # the string parts still count
    for unit, length in (("chars", 35), ("words", 1), ("tokens", 3)):
        result = make_component("rule.length", {"target": 0, "limit": 100, "unit": unit}).score(sample, make_prompt())
        assert result.error is None and result.details["length"] == length, (unit, result)
    assert make_component("rule.overlong", {"max_tokens": 10, "buffer": 2}).score(sample, make_prompt()).value == 0.0


@pytest.mark.parametrize("messages", [[{"role": "assistant", "content": 5}], [{"role": "assistant", "content": {"a": 1}}],
                                      ["<answer>42</answer>", None], [{"role": 5, "content": "x"}]])
def test_messages_of_the_wrong_shape_have_no_text(messages: list) -> None:
    sample = make_sample("", messages=messages, num_tokens=0)
    result = make_component("rule.format", {**THINK_ANSWER, "source": "response"}).score(sample, make_prompt())
    assert result.error is None and result.value == 0.0
    length = make_component("rule.length", {"target": 0, "limit": 10, "unit": "chars"}).score(sample, make_prompt())
    assert length.error is None and length.details["length"] == 0


@pytest.mark.parametrize("tag", ["answer\n", "answer ", "think\nx"])
def test_a_required_tag_name_with_a_line_end_is_refused(tag: str) -> None:
    from reward_models.rules import FormatRule

    with pytest.raises(ValueError, match="not tag names"):
        FormatRule({"required_tags": [tag]})
