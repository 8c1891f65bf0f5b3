"""The reward-component interface: what a component sees, what it returns, how params are checked.

A component is a pure function ``score(sample, prompt) -> ComponentResult`` behind a small class
(one instance per ``(kind, params)``). "Could not score" is an error with ``value=None``, never 0
(DESIGN.md, Rewards).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

FinishReason = str  # stop | length | max_turns | tool_misuse | tool_failure | env_error | timeout | aborted

# Every user-supplied number that scales a reward (weights, fixed values, score ranges) lies within
# +-MAX_REWARD_MAGNITUDE: sums of products of such numbers stay finite, so no input reaches inf/NaN.
MAX_REWARD_MAGNITUDE = 1e6
BoundedFloat = Annotated[float, Field(ge=-MAX_REWARD_MAGNITUDE, le=MAX_REWARD_MAGNITUDE, allow_inf_nan=False)]


@dataclass(frozen=True, slots=True)
class Sample:
    """One trajectory as a component sees it.

    ``messages``: ``[{"role", "content", "tool_calls"?: [{"id", "type": "function",
    "function": {"name", "arguments": str}}], "tool_call_id"?}]``.
    ``num_tokens``: model-generated response tokens, 0 if unknown. ``num_turns``: assistant turns.
    """

    messages: list[dict]
    final_answer: str
    finish_reason: FinishReason
    num_tokens: int
    num_turns: int
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PromptInfo:
    """The task a trajectory answers: prompt messages, reference (answer / tests / schema), metadata."""

    messages: list[dict]
    reference: dict
    metadata: dict
    dataset: str


@dataclass(frozen=True, slots=True)
class ComponentResult:
    """A component's answer for one sample: ``value`` is None iff ``error`` is set."""

    value: float | None
    details: dict
    error: str | None = None
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        if (self.value is None) == (self.error is None):
            raise ValueError("ComponentResult: exactly one of value and error must be set")


class ComponentError(Exception):
    """Raised inside ``evaluate`` when a component cannot decide (bad reference, judge down, ...)."""

    def __init__(self, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


class ParamsModel(BaseModel):
    """Base for component params: unknown keys are rejected, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(ParamsModel):
    """Params model for components that take none."""


def parse_params(model: type[BaseModel], kind: str, params: Mapping[str, Any]) -> BaseModel:
    """Validate ``params`` against ``model``; ValueError naming the first bad param."""
    try:
        return model.model_validate(dict(params))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        where = f"param '{loc}'" if loc else "params"
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise ValueError(f"{kind}: {where}: {msg}") from None


def canary_item(answer: str, reference: dict) -> tuple[Sample, PromptInfo]:
    """A one-message sample answering ``answer`` to a prompt with ``reference``."""
    message = {"role": "assistant", "content": answer}
    sample = Sample(messages=[message], final_answer=answer, finish_reason="stop", num_tokens=1, num_turns=1)
    return sample, PromptInfo(messages=[], reference=reference, metadata={}, dataset="canary")


def error_result(message: str, details: dict | None = None, latency_ms: float = 0.0) -> ComponentResult:
    """A result that records that the component could not score."""
    return ComponentResult(value=None, details=details or {}, error=message, latency_ms=latency_ms)


class RewardComponent(ABC):
    """One reward component. Subclasses set ``kind`` and ``Params`` and implement ``evaluate``.

    ``evaluate`` returns ``(value, details)`` or raises ``ComponentError``; ``score`` wraps it with
    timing and turns every exception into an error result (never a silent 0).
    Heavy resources (models, HTTP clients) are created lazily so constructing a component only
    validates params (RewardSpec validation constructs components).
    """

    kind: ClassVar[str]
    cpu_heavy: bool = False  # True: the Scorer runs it in the killable pool (an instance may set it)
    # the ``reference`` fields a prompt must carry to be scored (checked at ingest)
    reference_fields: ClassVar[tuple[str, ...]] = ()
    Params: ClassVar[type[BaseModel]] = NoParams

    @classmethod
    def reference_problem(cls, reference: Mapping[str, Any]) -> tuple[str, str] | None:
        """(field, what is wrong) when ``reference`` cannot be scored by this kind, else None (checked
        at ingest). Default: every one of ``reference_fields`` is present and not empty."""
        for name in cls.reference_fields:
            value = reference.get(name)
            if value is None or (not value.strip() if isinstance(value, str) else value in ([], {})):
                return name, "missing or empty"
        return None

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        self.params: Any = parse_params(self.Params, self.kind, params or {})

    @abstractmethod
    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        """Score one sample: ``(value, details)``; raise ComponentError when undecidable."""

    def score(self, sample: Sample, prompt: PromptInfo) -> ComponentResult:
        """Score one sample; any failure becomes an error result with the exception's message."""
        start = time.perf_counter()
        try:
            value, details = self.evaluate(sample, prompt)
        except ComponentError as exc:
            return error_result(str(exc), exc.details, _ms_since(start))
        except Exception as exc:  # noqa: BLE001 - a component bug is recorded as an error, not a 0
            return error_result(f"{type(exc).__name__}: {exc}", {}, _ms_since(start))
        return ComponentResult(value=float(value), details=details, latency_ms=_ms_since(start))

    def in_pool(self, sample: Sample, prompt: PromptInfo) -> bool:
        """Must this item run in the killable pool, under the deadline? (``cpu_heavy``, or a component
        whose cost depends on the item, e.g. a user regex on a long answer: ``reward_models.patterns``)"""
        return self.cpu_heavy

    def deadline_s(self) -> float:
        """The least time a worker-pool task of this component needs (0: the Scorer's default)."""
        return 0.0

    def canary(self) -> tuple[Sample, PromptInfo]:
        """A trivially easy item this component must score (any value, no error) well within its
        deadline; used to tell a slow answer from a sick verifier. Override where empty input errors."""
        return canary_item("", {})

    def score_batch(self, items: list[tuple[Sample, PromptInfo]]) -> list[ComponentResult]:
        """Score many samples; the default loops over ``score``. Returns one result per item."""
        return [self.score(sample, prompt) for sample, prompt in items]


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0
