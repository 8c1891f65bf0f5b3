"""verifier.math, verifier.exact_match, verifier.f1, verifier.json_schema."""

from __future__ import annotations

import pytest

from reward_models import make_component
from reward_models.text import normalize_answer, token_f1
from tests.reward_models.helpers import make_prompt, make_sample


def score(kind: str, answer: str, reference: dict, **params: object):
    return make_component(kind, params).score(make_sample(answer), make_prompt(reference))


@pytest.mark.parametrize(
    ("answer", "gold", "value"),
    [
        (r"The answer is $\boxed{42}$.", "42", 1.0),
        (r"So we get $\frac{1}{2}$", "0.5", 1.0),
        (r"$\boxed{\frac{2}{4}}$", r"\frac{1}{2}", 1.0),
        (r"$\boxed{x = 3}$", "3", 1.0),
        (r"$\boxed{\sqrt{2}/2}$", r"\frac{\sqrt{2}}{2}", 1.0),
        (r"The answer is $\boxed{41}$.", "42", 0.0),
        (r"$\boxed{0.33}$", r"\frac{1}{3}", 0.0),
    ],
)
def test_math_equivalence(answer: str, gold: str, value: float) -> None:
    assert score("verifier.math", answer, {"answer": gold}).value == value


def test_math_any_of_several_references() -> None:
    assert score("verifier.math", r"$\boxed{-2}$", {"answer": ["2", "-2"]}).value == 1.0


def test_math_no_answer_in_response_is_a_fail() -> None:
    result = score("verifier.math", "I am not sure.", {"answer": "42"})
    assert result.value == 0.0
    assert result.details == {"extracted": None}


@pytest.mark.parametrize("reference", [{}, {"answer": None}, {"answer": ""}])
def test_math_bad_reference_is_an_error(reference: dict) -> None:
    result = score("verifier.math", r"$\boxed{42}$", reference)
    assert result.value is None and result.error


@pytest.mark.parametrize(
    ("text", "normalised"),
    [("The  Eiffel Tower!", "eiffel tower"), ("an apple, a pear", "apple pear"), ("  ", "")],
)
def test_squad_normalisation(text: str, normalised: str) -> None:
    assert normalize_answer(text) == normalised


@pytest.mark.parametrize(
    ("pred", "ref", "f1"),
    [
        ("Paris", "Paris", 1.0),
        ("the city of Paris", "Paris", 2 * (1 / 3) * 1 / (1 / 3 + 1)),  # tokens: city of paris
        ("London", "Paris", 0.0),
        ("", "", 1.0),
        ("", "Paris", 0.0),
        ("a b b", "b b c", 0.8),  # 'a' is an article: [b, b] vs [b, b, c]; p = 1, r = 2/3
        ("x x y", "x y y", 2 / 3),  # common {x: 1, y: 1}: p = r = 2/3
    ],
)
def test_token_f1_hand_values(pred: str, ref: str, f1: float) -> None:
    assert token_f1(pred, ref) == pytest.approx(f1)


def test_exact_match_normalises_and_takes_any_reference() -> None:
    assert score("verifier.exact_match", "The Eiffel Tower.", {"answer": "eiffel tower"}).value == 1.0
    assert score("verifier.exact_match", "Eiffel", {"answer": ["Tour Eiffel", "Eiffel"]}).value == 1.0
    assert score("verifier.exact_match", "Eiffel Tower", {"answer": "Louvre"}).value == 0.0
    assert (
        score("verifier.exact_match", "The Eiffel Tower.", {"answer": "eiffel tower"}, normalize=False).value
        == 0.0
    )


def test_exact_match_with_extraction() -> None:
    params = {"extract_pattern": r"<answer>(.*?)</answer>"}
    hit = score(
        "verifier.exact_match", "<think>Paris?</think><answer>Paris</answer>", {"answer": "Paris"}, **params
    )
    assert hit.value == 1.0 and hit.details["extracted"] == "Paris"
    miss = score("verifier.exact_match", "Paris", {"answer": "Paris"}, **params)
    assert miss.value == 0.0 and miss.details == {"extracted": None}


def test_f1_is_the_best_over_references() -> None:
    result = score("verifier.f1", "Barack Obama", {"answer": ["Obama", "Barack Hussein Obama"]})
    assert result.value == pytest.approx(0.8)  # vs 3-token ref: p = 1, r = 2/3


def test_qa_missing_answer_is_an_error() -> None:
    assert score("verifier.f1", "x", {"tests": "assert True"}).error == "prompt reference has no 'answer'"


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ('{"name": "Ada", "age": 36}', 1.0),
        ('Here you go:\n```json\n{"name": "Ada", "age": 36}\n```', 1.0),
        ('{"name": "Ada"}', 0.0),
        ('{"name": "Ada", "age": "36"}', 0.0),
        ('{"name": "Ada", "age": 36', 0.0),
        ("", 0.0),
    ],
)
def test_json_schema(answer: str, value: float) -> None:
    assert score("verifier.json_schema", answer, {"schema": SCHEMA}).value == value


def test_json_schema_from_params_and_errors() -> None:
    assert score("verifier.json_schema", '{"name": "a", "age": 1}', {}, schema=SCHEMA).value == 1.0
    failed = score("verifier.json_schema", '{"name": 1, "age": 1}', {}, schema=SCHEMA)
    assert failed.value == 0.0 and failed.details["path"] == ["name"]
    assert score("verifier.json_schema", "{}", {}).error == "no schema (reference.schema or params.schema)"
    bad = score("verifier.json_schema", "{}", {"schema": {"type": "bogus"}})
    assert bad.value is None and "invalid JSON schema" in (bad.error or "")


def test_math_details_show_at_most_200_characters_of_a_huge_answer() -> None:
    """The extracted answer goes into stored details: a 5,000-digit answer is a fail with a short note."""
    component = make_component("verifier.math", {})
    result = component.score(make_sample("\\boxed{" + "9" * 5000 + "}"), make_prompt({"answer": "42"}))
    assert result.error is None and result.value == 0.0
    assert 0 < len(result.details["extracted"]) <= 200
