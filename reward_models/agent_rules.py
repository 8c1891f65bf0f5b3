"""Rule components for agent trajectories: tool-call validity, repetition and loop detection."""

from __future__ import annotations

import json
import threading
from collections import Counter, OrderedDict
from typing import Any, Literal

import jsonschema
from pydantic import Field, field_validator

from reward_models.base import BoundedFloat, ComponentError, ParamsModel, PromptInfo, RewardComponent, Sample
from reward_models.text import (
    NotJson,
    assistant_text,
    canonical_json,
    json_depth_exceeds,
    parse_model_json,
    tool_calls,
)

_MAX_LISTED_ERRORS = 20
_VALIDATOR_CACHE_SIZE = 256


def tool_schemas(tools: list[dict]) -> dict[str, dict]:
    """``name -> JSON schema of the arguments`` from OpenAI tool specs
    (``{"type": "function", "function": {"name", "parameters"}}``) or bare ``{"name", "parameters"}``."""
    schemas: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        spec = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ValueError(f"tools[{i}]: needs a function name")
        schema = spec.get("parameters") or {"type": "object"}
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ValueError(
                f"tools[{i}] ({spec['name']}): invalid parameters schema: {exc.message}"
            ) from None
        schemas[spec["name"]] = schema
    return schemas


def _validators(schemas: dict[str, dict]) -> dict[str, Any]:
    return {name: jsonschema.validators.validator_for(s)(s) for name, s in schemas.items()}


def call_problem(call: Any, validators: dict[str, Any]) -> str | None:
    """Why one OpenAI tool call is invalid (None if valid): malformed, arguments not JSON (nested too
    deeply or a 5,000-digit integer included), unknown tool, arguments not matching the tool's schema.
    Whatever the model wrote is an answer here, never an exception."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return "malformed tool call (no function name)"
    name, arguments = function["name"], function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = parse_model_json(arguments)
        except NotJson as exc:
            return f"arguments are not JSON: {exc}"
    elif json_depth_exceeds(arguments):
        return "arguments are not JSON: nested too deeply"
    if not isinstance(arguments, dict):
        return "arguments are not a JSON object"
    if name not in validators:
        return f"unknown tool {name!r}"
    try:
        error = jsonschema.exceptions.best_match(validators[name].iter_errors(arguments))
    except (RecursionError, ValueError, TypeError, OverflowError) as exc:  # e.g. a huge int vs multipleOf
        return f"arguments could not be validated: {type(exc).__name__}: {str(exc)[:200]}"
    return None if error is None else f"arguments invalid: {error.message[:500]}"


def has_user_regex(schema: Any) -> bool:
    """Does a JSON schema use ``pattern`` / ``patternProperties``? (``re``, backtracking: validating
    the model's arguments against it may take any time, so it runs under a deadline)"""
    stack = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("pattern"), str) or isinstance(item.get("patternProperties"), dict):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class ToolCallParams(ParamsModel):
    tools: list[dict] | None = None
    mode: Literal["fraction", "all"] = "fraction"
    no_calls_value: BoundedFloat = 1.0

    @field_validator("tools")
    @classmethod
    def _tools(cls, tools: list[dict] | None) -> list[dict] | None:
        if tools is not None:
            tool_schemas(tools)
        return tools


class ToolCallRule(RewardComponent):
    """Fraction of valid tool calls (``mode="fraction"``) or 1/0 for all valid (``mode="all"``).

    Tools come from ``params.tools``, else ``prompt.metadata["tools"]`` (OpenAI format).
    """

    kind = "rule.tool_calls"
    Params = ToolCallParams

    def __init__(self, params: dict | None = None) -> None:
        super().__init__(params)
        tools = self.params.tools
        self._fixed = _validators(tool_schemas(tools)) if tools is not None else None
        self._cache: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        # a user regex in the tools' schemas: every item with calls is validated in the killable pool
        self.cpu_heavy = tools is not None and has_user_regex(tools)

    def in_pool(self, sample: Sample, prompt: PromptInfo) -> bool:
        """Validation runs in the pool, under the deadline, when a tool schema has a (backtracking)
        regex: the model's arguments could make it take any time (a timeout is then a fail, 0)."""
        if not tool_calls(sample):
            return False
        if self.params.tools is not None:
            return self.cpu_heavy
        return has_user_regex(prompt.metadata.get("tools"))

    def _prompt_validators(self, prompt: PromptInfo) -> dict[str, Any]:
        tools = prompt.metadata.get("tools")
        if tools is None:
            raise ComponentError("no tool definitions (params.tools or prompt.metadata.tools)")
        key = json.dumps(tools, sort_keys=True)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            validators = _validators(tool_schemas(tools))
        except ValueError as exc:
            raise ComponentError(f"prompt tools: {exc}") from None
        with self._lock:
            self._cache[key] = validators
            if len(self._cache) > _VALIDATOR_CACHE_SIZE:
                self._cache.popitem(last=False)
        return validators

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        calls = tool_calls(sample)
        if not calls:
            return self.params.no_calls_value, {"calls": 0, "valid": 0, "errors": []}
        validators = self._fixed if self._fixed is not None else self._prompt_validators(prompt)
        problems = [(i, call_problem(c, validators)) for i, c in enumerate(calls)]
        errors = [{"index": i, "error": p} for i, p in problems if p is not None]
        valid = len(calls) - len(errors)
        value = valid / len(calls) if self.params.mode == "fraction" else float(valid == len(calls))
        details = {"calls": len(calls), "valid": valid, "errors": errors[:_MAX_LISTED_ERRORS]}
        return value, details


def repeated_ngram_fraction(tokens: list[str], n: int) -> float:
    """1 - distinct / total n-grams of ``tokens`` (0.0 when there is no n-gram).

    The n-gram repetition measure of Yeo et al. 2025 (Demystifying Long Chain-of-Thought Reasoning).
    """
    total = len(tokens) - n + 1
    if total <= 0:
        return 0.0
    distinct = len({tuple(tokens[i : i + n]) for i in range(total)})
    return 1.0 - distinct / total


def call_key(call: Any) -> str | None:
    """Canonical identity of a tool call: name + arguments with sorted keys (the raw string if it is not
    JSON); None for a call without an identity (malformed, or arguments JSON cannot write), which is
    never counted as a repeat."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return None
    name = function.get("name") if isinstance(function.get("name"), str) else None
    arguments = function.get("arguments", "")
    if isinstance(arguments, str):
        try:
            arguments = parse_model_json(arguments)
        except NotJson:
            return f"{name}|{arguments}"
    canonical = canonical_json(arguments)
    return None if canonical is None else f"{name}|{canonical}"


class RepetitionParams(ParamsModel):
    n: int = Field(default=4, ge=1)
    unit: Literal["word", "char"] = "word"
    min_ratio: float = Field(default=0.2, ge=0.0, lt=1.0)
    max_identical_calls: int = Field(default=3, ge=2)
    source: Literal["final_answer", "response"] = "response"


class RepetitionRule(RewardComponent):
    """Penalty in [-1, 0] for repeated text and tool-call loops.

    text penalty = clip((r - min_ratio) / (1 - min_ratio), 0, 1) with r the repeated n-gram fraction;
    a tool call made ``max_identical_calls`` times or more with identical arguments is a loop (-1).
    """

    kind = "rule.repetition"
    Params = RepetitionParams

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        p = self.params
        text = sample.final_answer if p.source == "final_answer" else assistant_text(sample)
        tokens = text.split() if p.unit == "word" else list(text)
        ratio = repeated_ngram_fraction(tokens, p.n)
        text_penalty = min(max((ratio - p.min_ratio) / (1.0 - p.min_ratio), 0.0), 1.0)
        counts = Counter(key for c in tool_calls(sample) if (key := call_key(c)) is not None)
        most = max(counts.values(), default=0)
        loop = most >= p.max_identical_calls
        value = -max(text_penalty, 1.0 if loop else 0.0)
        return value, {"repeated_ngram_fraction": ratio, "max_identical_calls": most, "loop": loop}
