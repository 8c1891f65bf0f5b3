"""verifier.math reads a delimiter-less answer span / region and reference as LaTeX (the whole expression),
never as its first number: ``2^{100}`` is not ``2``, ``3x+1`` is not ``3`` (issue #25)."""

from __future__ import annotations

import pytest

from reward_models import make_component
from reward_models.verifiers import read_math
from tests.reward_models.helpers import make_prompt, make_sample


def math(completion: str, gold: str) -> float:
    return make_component("verifier.math", {}).score(make_sample(completion), make_prompt({"answer": gold})).value


TABLE = [  # (answer, gold, value); each row is checked in the tagged span, and the region without a tag
    (r"2^{100}", "2", 0.0),
    (r"2^{10}", "1024", 1.0),
    ("1024", r"2^{10}", 1.0),
    ("2", r"2^{10}", 0.0),
    ("3", "3x+1", 0.0),
    ("3x+1", "3x+1", 1.0),
    (r"3x+1", "1+3x", 1.0),
    ("2", r"2\sqrt{3}", 0.0),
    (r"2\sqrt{3}", "2", 0.0),
    (r"2\sqrt{3}", r"2\sqrt{3}", 1.0),
    ("2", r"2\pi", 0.0),
    (r"2\pi", "2", 0.0),
    (r"2 \times 10^{3}", "2000", 1.0),
    ("42", "42", 1.0),
    ("41", "42", 0.0),
    ("-3", "-3", 1.0),
    ("-3", "3", 0.0),
    ("0.5", "1/2", 1.0),
    ("1/2", r"\frac{1}{2}", 1.0),
    (r"\frac{1}{2}", "0.5", 1.0),
    (r"-\frac{1}{2}", "-0.5", 1.0),
    (r"\dfrac{3}{4}", "0.75", 1.0),
    ("2.5", "2", 0.0),
    ("3.14", "3.14", 1.0),
    ("1,000", "1000", 1.0),
    (r"\boxed{3}", "3x+1", 0.0),
    (r"\boxed{2^{10}}", "1024", 1.0),
    (r"\boxed{3}", "3", 1.0),
    (r"$2^{10}$", "1024", 1.0),
    ("x^2+1", "1+x^2", 1.0),
    ("The answer is 5 apples", "5", 1.0),
]


@pytest.mark.parametrize(("answer", "gold", "value"), TABLE)
def test_tagged_answer_and_gold_are_read_as_latex(answer: str, gold: str, value: float) -> None:
    assert math(f"<think>x</think><answer>{answer}</answer>", gold) == value


@pytest.mark.parametrize(("answer", "gold", "value"), TABLE)
def test_answer_region_without_a_tag_is_read_the_same(answer: str, gold: str, value: float) -> None:
    assert math(f"<think>x</think>{answer}", gold) == value


# references are bare expressions: a row whose answer is prose or $-delimited cannot be swapped into one
@pytest.mark.parametrize(("answer", "gold", "value"),
                         [(a, g, v) for a, g, v in TABLE if "\\boxed" not in g and "apples" not in a and "$" not in a])
def test_both_directions(answer: str, gold: str, value: float) -> None:
    """Swapping answer and reference gives the same verdict (equivalence is symmetric for these)."""
    assert math(f"<answer>{gold}</answer>", answer) == value


def test_plain_numbers_are_read_exactly() -> None:
    assert [str(x) for x in read_math("12345678901234567890")][-1] == "12345678901234567890"
    assert read_math("  ") == []
