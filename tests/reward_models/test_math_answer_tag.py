"""verifier.math reads the R1 format: the last complete <answer>...</answer> span, over hostile output."""

from __future__ import annotations

import pytest

from reward_models import make_component
from reward_models.verifiers import tagged_span
from tests.reward_models.helpers import make_prompt, make_sample


def score(answer: str, gold: str = "42", **params: object):
    return make_component("verifier.math", params).score(make_sample(answer), make_prompt({"answer": gold}))


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ("<answer>42</answer>", 1.0),
        ("<think>6*7 = 42</think>\n<answer> 42 </answer>", 1.0),
        (r"<think>so 7</think><answer>\boxed{42}</answer>", 1.0),
        ("<ANSWER>42</Answer>", 1.0),  # tags are case-insensitive
        ("<think>it is 42</think><answer>41</answer>", 0.0),  # the tag wins over a number in the reasoning
        ("<answer>41</answer> then <answer>42</answer>", 1.0),  # several: the last
        ("<answer>42</answer> then <answer>41</answer>", 0.0),
        ("<answer><answer>41</answer>42</answer>", 1.0),  # nested: the text right before the last closing tag
        ("<answer>42<answer>41</answer></answer>", 0.0),  # ... here none: the span never holds a tag
        ("<answer>41 <answer>42</answer>", 1.0),  # an opening tag never closed before the last pair
        ("<answer></answer>", 0.0),  # empty span: no answer
    ],
)
def test_answer_tag(answer: str, value: float) -> None:
    assert score(answer).value == value


def test_reasoning_number_no_longer_read_as_the_answer() -> None:
    """math-verify alone reads "so 7" out of this text; the tag gives the model's own answer."""
    result = score("<think>1+1=2 so 7</think><answer>2</answer>", gold="2")
    assert result.value == 1.0 and result.details["extracted"] == "2"


def test_fraction_and_bare_expression_in_the_tag() -> None:
    assert score(r"<answer>\frac{1}{2}</answer>", gold="0.5").value == 1.0
    assert score("<answer>x^2+1</answer>", gold="x^2+1").value == 1.0  # bare LaTeX is retried in $...$


def test_unclosed_tag_falls_back_to_the_whole_text_unless_required() -> None:
    assert score(r"<answer>\boxed{42}").value == 1.0  # no complete span: math-verify reads the whole text
    strict = score(r"<answer>\boxed{42}", require_tag=True)
    assert strict.value == 0.0 and strict.details["extracted"] is None and "<answer>" in strict.details["reason"]
    assert score(r"\boxed{42}", require_tag=True).value == 0.0
    assert score("<answer>42</answer>", require_tag=True).value == 1.0


def test_tag_off_and_other_tag() -> None:
    assert score("<think>so 7</think><answer>2</answer>", gold="2", answer_tag=None).value == 0.0  # as before
    assert score("<final>42</final>", answer_tag="final").value == 1.0


@pytest.mark.parametrize("tag", ["", "a b", "<answer>", "x" * 40, "answer)|(.*"])
def test_bad_tag_param_is_rejected(tag: str) -> None:
    with pytest.raises(ValueError, match="answer_tag"):
        make_component("verifier.math", {"answer_tag": tag})


def test_huge_and_many_tags_are_linear() -> None:
    """A megabyte of opening tags, or of pairs: two rfind scans, no backtracking, the last pair's span."""
    many_open = "<answer>" * 200_000
    assert tagged_span(many_open, "answer") is None
    assert tagged_span(many_open + "42</answer>", "answer") == "42"
    pairs = "<answer>1</answer>" * 100_000 + "<answer>42</answer>"
    assert tagged_span(pairs, "answer") == "42"
    assert score(pairs).value == 1.0
    closes = "</answer>" * 200_000
    assert tagged_span(closes, "answer") is None
    assert score("x" * 1_000_000 + "<answer>42</answer>").value == 1.0


def test_tag_span_edges() -> None:
    assert tagged_span("", "answer") is None
    assert tagged_span("</answer><answer>", "answer") is None  # the close comes before any open
    assert tagged_span("<answer>a</answer>b</answer>", "answer") == "b"
    assert tagged_span("<answer>a</answer></answer>", "answer") == ""
    assert tagged_span("<answer>\ud800</answer>", "answer") == "\ud800"  # a lone surrogate is just text


# --- one tag rule (reward_models.tags) for verifier.math and rule.format ---------------------------------------

def fmt(answer: str, tags: tuple[str, ...] = ("answer",), **params: object) -> float:
    component = make_component("rule.format", {"required_tags": list(tags), **params})
    return component.score(make_sample(answer), make_prompt()).value


@pytest.mark.parametrize("prefix", ["İ", "İ" * 50, "ẞ", "ﬃ", "ǅ", "Σ" * 7, "\u0130\u0049"])
def test_a_character_whose_lowercase_is_longer_does_not_shift_the_span(prefix: str) -> None:
    """'İ'.lower() is two code points: indices found in str.lower() would slice the original off by one
    per such character. ASCII-only folding keeps them the original's."""
    text = f"{prefix}<answer>42</answer>"
    assert tagged_span(text, "answer") == "42"
    assert tagged_span(f"<think>{prefix}</think>{prefix}<ANSWER>{prefix}42</answer>", "answer") == f"{prefix}42"
    result = score(text)
    assert result.value == 1.0 and result.details["extracted"] == "42"
    assert fmt(f"{prefix}<answer>{prefix}</answer>") == 1.0  # nonempty reads the original's span
    assert fmt(f"{prefix}<answer> </answer>") == 0.0


def test_the_premise_of_the_shift() -> None:
    assert len("İ".lower()) == 2  # why str.lower() indices cannot slice the original


@pytest.mark.parametrize("text", ["<ANSWER>42</ANSWER>", "<Answer>42</aNsWeR>", "<answer>42</answer>"])
def test_tag_case_is_one_rule_for_the_verifier_and_the_format(text: str) -> None:
    assert score(text).value == 1.0
    assert fmt(text) == 1.0
    assert fmt(f"<THINK>so</Think>{text}", ("think", "answer")) == 1.0


@pytest.mark.parametrize(
    "text",
    [
        "<think>the answer: <answer>42</answer></think>",
        "<think>the answer: <answer>42</answer></think><answer>41</answer>",
        "<think>maybe <answer>42</answer></think> I am not sure",
        "<think>unclosed reasoning <answer>42</answer>",
        "<answer>41</answer><think>changed my mind: <answer>42</answer>",
        "<THINK><ANSWER>42</ANSWER></THINK>",
    ],
)
def test_an_answer_written_in_the_reasoning_collects_no_reward(text: str) -> None:
    """The answer follows the think block: an <answer> inside it is reasoning. Neither the verifier (its
    tag, nor its fallback over the whole text) nor the format rule pays for it."""
    assert score(text).value == 0.0
    assert score(text, require_tag=True).value == 0.0
    assert fmt(text) == 0.0
    assert fmt(text, ("think", "answer"), ordered=False) == 0.0


def test_the_answer_after_the_reasoning_counts() -> None:
    text = "<think>try <answer>41</answer>, no</think>\n<answer>42</answer>"
    assert score(text).value == 1.0 and score(text).details["extracted"] == "42"
    assert fmt("<think>so</think><answer>42</answer>", ("think", "answer")) == 1.0
    # no answer tag after the reasoning: math-verify reads only the text after it
    assert score(r"<think>it is \boxed{42}</think> so \boxed{41}").value == 0.0
    assert score(r"<think>it is \boxed{41}</think> so \boxed{42}").value == 1.0
    assert score(r"<think>it is \boxed{42}</think>").value == 0.0


def test_think_tag_off_or_renamed() -> None:
    text = "<think><answer>42</answer></think>"
    assert score(text, think_tag=None).value == 1.0  # no reasoning tag: every <answer> counts
    assert fmt(text, think_tag=None) == 1.0
    assert score("<reason><answer>42</answer></reason>", think_tag="reason").value == 0.0
    assert fmt("<reason><answer>42</answer></reason>", think_tag="reason") == 0.0
    with pytest.raises(ValueError, match="differ"):
        make_component("verifier.math", {"answer_tag": "think", "think_tag": "THINK"})


# Attack (round 2): a chat template that ends the prompt with "<think>\n" (DeepSeek-R1-Distill, Qwen3) makes the
# completion start inside the reasoning; with starts_in_think an answer written there before any </think> counts
# for neither verifier.math nor rule.format, and an answer after the </think> still does.
@pytest.mark.parametrize(("completion", "math_value", "format_value"), [
    ("maybe <answer>2</answer> still thinking", 0.0, 0.0),
    ("maybe \\boxed{2}, still thinking", 0.0, None),
    ("thinking</think><answer>2</answer>", 1.0, 1.0),
    ("<answer>2</answer></think>hmm", 0.0, 0.0),
])
def test_starts_in_think_reads_an_unclosed_completion_as_reasoning(completion, math_value, format_value):
    from reward_models.tags import answer_region, fold

    assert answer_region(fold("no close at all"), starts_in_think=True) == (15, 15)
    assert score(completion, gold="2", starts_in_think=True).value == math_value
    if format_value is not None:
        assert fmt(completion, starts_in_think=True) == format_value
    assert score("maybe <answer>2</answer> still thinking", gold="2").value == 1.0  # default: the completion alone
