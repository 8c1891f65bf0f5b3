"""Verifier components: math equivalence (math-verify), exact match, token F1, JSON-schema validity.

Outcome verifiers return 1.0 (pass) / 0.0 (fail); a missing or unparseable reference is an error.
``verifier.math`` is ``cpu_heavy``: the Scorer runs it in a KillablePool, which enforces its time
limit, so math-verify's own ``signal.alarm`` timeouts are switched off (they fail off the main thread).
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Mapping
from typing import Any, Literal

import jsonschema
from pydantic import Field, field_validator, model_validator

from reward_models.base import (
    ComponentError,
    ParamsModel,
    PromptInfo,
    RewardComponent,
    Sample,
    canary_item,
)
from reward_models.patterns import UserPattern
from reward_models.tags import THINK_TAG, fold, outside_reasoning, tagged_span
from reward_models.text import NotJson, normalize_answer, parse_model_json, token_f1

_JSON_FENCE = re.compile(r"```[ \t]*(?:json)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

# We enforce time limits by killing worker processes; math-verify warns once when its own are off.
for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).setLevel(logging.ERROR)


def reference_answers(prompt: PromptInfo) -> list[str]:
    """``reference["answer"]`` as a list of strings (a list means "any of these")."""
    if "answer" not in prompt.reference or prompt.reference["answer"] is None:
        raise ComponentError("prompt reference has no 'answer'")
    answer = prompt.reference["answer"]
    answers = answer if isinstance(answer, list) else [answer]
    return [str(a) for a in answers]


def answer_problem(reference: Mapping[str, Any]) -> tuple[str, str] | None:
    """What ``reference_answers`` cannot use: no answer, an empty list, or an item that is not a
    non-blank string or a number. (Math answers are not parsed here: parsing runs sympy, whose time
    on a hostile answer is unbounded; the scorer parses them under its deadline.)"""
    answer = reference.get("answer")
    if answer is None:
        return "answer", "missing"
    answers = answer if isinstance(answer, list) else [answer]
    if not answers:
        return "answer", "must be a non-empty string or number, or a non-empty list of them; got []"
    for i, a in enumerate(answers):
        where = f"answer[{i}]" if isinstance(answer, list) else "answer"
        if a is None or isinstance(a, bool) or not isinstance(a, str | int | float) or not str(a).strip():
            return where, f"must be a non-empty string or a number; got {json.dumps(a)[:40]}"
    return None


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> tuple[Any, ...]:
    return tuple(read_math(answer))


class MathParams(ParamsModel):
    float_rounding: int = Field(default=6, ge=0)
    numeric_precision: int = Field(default=15, ge=1)
    strict: bool = True
    # the R1 format (reward_models.tags, the rule rule.format shares): the answer is the last complete
    # <answer>...</answer> span (ASCII case-insensitive) after the reasoning (<think_tag>...</think_tag>);
    # None: no tag is looked for. ``require_tag``: without a complete span the answer is "none" (0.0), else
    # the text outside the reasoning is parsed (math-verify finds \boxed{}, "the answer is", a last number)
    answer_tag: str | None = Field(default="answer", pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
    require_tag: bool = False
    think_tag: str | None = Field(default=THINK_TAG, pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
    starts_in_think: bool = False  # the prompt opened <think_tag> (reward_models.tags.answer_region)

    @model_validator(mode="after")
    def _distinct_tags(self) -> MathParams:
        if self.answer_tag is not None and self.think_tag is not None and fold(self.answer_tag) == fold(self.think_tag):
            raise ValueError("answer_tag and think_tag must differ")
        return self


# a plain number (an integer, a decimal, thousands separators, a sign, a ratio of integers): read as is, exactly
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:/\d+)?|[+-]?\.\d+")
_DELIMITED = ("$", "\\(", "\\[")  # math-verify finds LaTeX between these itself
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")  # a word that is not a LaTeX command (\frac, \pi)


def read_math(text: str) -> list[Any]:
    """math-verify's reading of one answer (a reference, or a model's answer span / answer region).

    An expression without delimiters is read as LaTeX first: math-verify's own reading of bare text takes its
    *first number*, so ``2^{100}`` would be ``2``, ``3x+1`` ``3`` and ``2\\sqrt{3}`` ``2``; wrapped in ``$...$``
    the whole expression is parsed. A plain number is read as is (exact), and text with delimiters, or prose
    (two or more words: "the answer is 5 apples"), is left to math-verify's extraction (``\\boxed{}``, "the
    answer is", the last number); when the LaTeX reading finds nothing, so is the expression."""
    from math_verify import parse

    stripped = text.strip()
    if not stripped:
        return []
    if _PLAIN_NUMBER.fullmatch(stripped) or any(d in stripped for d in _DELIMITED) or len(_WORD.findall(stripped)) >= 2:
        return parse(stripped, parsing_timeout=None)
    return parse(f"${stripped}$", parsing_timeout=None) or parse(stripped, parsing_timeout=None)


def parse_prediction(text: str) -> list[Any]:
    """math-verify's parse of a model's answer span (``read_math``)."""
    return read_math(text)


class MathVerifier(RewardComponent):
    """1.0 when the final answer is mathematically equivalent to any reference answer (math-verify,
    Kydlicek et al., HuggingFace 2025); 0.0 when it is not or has no extractable answer."""

    kind = "verifier.math"
    reference_fields = ("answer",)
    reference_problem = staticmethod(answer_problem)
    cpu_heavy = True
    Params = MathParams

    def canary(self) -> tuple[Sample, PromptInfo]:
        return canary_item("2", {"answer": "2"})

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        from math_verify import verify

        golds = [_parse_gold(a) for a in reference_answers(prompt)]
        if not any(golds):
            raise ComponentError("could not parse the reference answer")
        p = self.params
        text = sample.final_answer
        span = tagged_span(text, p.answer_tag, p.think_tag, p.starts_in_think) if p.answer_tag else None
        if span is None and p.answer_tag and p.require_tag:
            return 0.0, {"extracted": None, "reason": f"no complete <{p.answer_tag}>...</{p.answer_tag}> "
                                                      f"after the reasoning"}
        if span is None and p.answer_tag:  # an answer is never read out of the reasoning
            text = outside_reasoning(text, p.think_tag, p.starts_in_think)
        pred = read_math(span if span is not None else text)
        if not pred:
            return 0.0, {"extracted": None}
        ok = any(
            verify(
                list(g),
                pred,
                float_rounding=p.float_rounding,
                numeric_precision=p.numeric_precision,
                strict=p.strict,
                timeout_seconds=None,
            )
            for g in golds
            if g
        )
        return float(ok), {"extracted": _shown(pred[-1])}


def _shown(extracted: Any) -> str:
    """What a details field shows of an extracted answer: at most 200 characters; a parsed expression
    too deep to print is shown as such (the answer is the model's, its printing must not fail)."""
    try:
        return str(extracted)[:200]
    except (RecursionError, ValueError):  # ValueError: an integer over 4,300 digits
        return f"<{type(extracted).__name__} too large to show>"


class MatchParams(ParamsModel):
    extract_pattern: str | None = None
    normalize: bool = True

    @field_validator("extract_pattern")
    @classmethod
    def _pattern(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            UserPattern(pattern)
        return pattern


def extract_answer(text: str, regex: UserPattern | None) -> str | None:
    """The answer span: the last match's ``answer`` group (else group 1, else whole match); the
    whole text when there is no pattern; None when the pattern does not match."""
    if regex is None:
        return text
    matches = list(regex.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    if "answer" in regex.groupindex:
        return last.group("answer")
    return last.group(1) if regex.groups else last.group(0)


class _QAVerifier(RewardComponent):
    reference_fields = ("answer",)
    reference_problem = staticmethod(answer_problem)

    Params = MatchParams

    def __init__(self, params: dict | None = None) -> None:
        super().__init__(params)
        pattern = self.params.extract_pattern
        self._regex = UserPattern(pattern) if pattern else None
        self.cpu_heavy = self._regex is not None and not self._regex.inline_pattern  # see reward_models.patterns

    def in_pool(self, sample: Sample, prompt: PromptInfo) -> bool:
        return self.cpu_heavy or (self._regex is not None and not self._regex.inline_ok(sample.final_answer))

    def canary(self) -> tuple[Sample, PromptInfo]:
        return canary_item("", {"answer": ""})

    def _prediction(self, sample: Sample) -> str | None:
        return extract_answer(sample.final_answer, self._regex)


class ExactMatchVerifier(_QAVerifier):
    """1.0 when the (SQuAD-normalised) answer equals any reference answer, else 0.0."""

    kind = "verifier.exact_match"

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        refs = reference_answers(prompt)
        pred = self._prediction(sample)
        if pred is None:
            return 0.0, {"extracted": None}
        norm = normalize_answer if self.params.normalize else str.strip
        ok = any(norm(pred) == norm(r) for r in refs)
        return float(ok), {"extracted": pred[:200]}


class F1Verifier(_QAVerifier):
    """Max token F1 over reference answers (SQuAD, Rajpurkar et al. 2016), in [0, 1]."""

    kind = "verifier.f1"

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        refs = reference_answers(prompt)
        pred = self._prediction(sample)
        if pred is None:
            return 0.0, {"extracted": None}
        return max(token_f1(pred, r) for r in refs), {"extracted": pred[:200]}


def check_schema(schema: Any) -> None:
    """Raise ValueError if ``schema`` is not a valid JSON schema (for its declared draft)."""
    if not isinstance(schema, dict):
        raise ValueError("schema must be a JSON object")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"invalid JSON schema: {exc.message}") from None


def extract_json_text(text: str, extract: str) -> str:
    """The JSON text to validate: the last fenced (```json) block in ``auto`` mode, else all text."""
    if extract == "auto":
        blocks = _JSON_FENCE.findall(text)
        if blocks:
            return blocks[-1]
    return text.strip()


class JsonSchemaParams(ParamsModel):
    schema_: dict | None = Field(default=None, alias="schema")
    extract: Literal["auto", "whole"] = "auto"

    @field_validator("schema_")
    @classmethod
    def _schema(cls, schema: dict | None) -> dict | None:
        if schema is not None:
            check_schema(schema)
        return schema


class JsonSchemaVerifier(RewardComponent):
    """1.0 when the answer is JSON valid against ``reference["schema"]`` (else ``params.schema``)."""

    kind = "verifier.json_schema"
    cpu_heavy = True  # user-supplied `pattern`s (backtracking re) and schemas: killable pool, deadline
    Params = JsonSchemaParams

    def canary(self) -> tuple[Sample, PromptInfo]:
        return canary_item("{}", {"schema": {"type": "object"}})

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        schema = prompt.reference.get("schema", self.params.schema_)
        if schema is None:
            raise ComponentError("no schema (reference.schema or params.schema)")
        try:
            check_schema(schema)
        except ValueError as exc:
            raise ComponentError(f"reference schema: {exc}") from None
        try:
            document = parse_model_json(extract_json_text(sample.final_answer, self.params.extract))
        except NotJson as exc:  # not JSON, NaN, an int over 4300 digits, too deep
            return 0.0, {"reason": "not_json", "error": f"not JSON: {exc}"}
        try:
            validator = jsonschema.validators.validator_for(schema)(schema)
            error = jsonschema.exceptions.best_match(validator.iter_errors(document))
        except (RecursionError, ValueError, TypeError, OverflowError) as exc:  # the answer broke validation
            return 0.0, {"reason": "invalid_answer", "error": f"could not validate: {_why(exc)}"}
        if error is not None:
            return 0.0, {"error": error.message[:500], "path": list(error.absolute_path)}
        return 1.0, {}


def _why(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc)[:200]
