"""Ingest's wire types (pydantic v2): prompts and groups in, groups read back (DESIGN.md's API v1).
Separate from the ORM models; the types every domain shares are in ``service.api.schemas``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)

from service.api.schemas import (
    INT4_MAX,
    MAX_MESSAGES,
    FinishReason,
    FreeJson,
    Int4,
    Key,
    Message,
    Name,
    Strict,
)


class PromptIn(FreeJson):
    dataset: Name = "default"
    messages: list[Message] = Field(default_factory=list, max_length=MAX_MESSAGES)
    reference: dict[str, Any] = Field(default_factory=dict)
    reward_spec: Name | None = None
    curation_policy: Name | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class PromptUpsert(PromptIn):
    id: Key


class PromptsIn(Strict):
    prompts: list[PromptUpsert] = Field(min_length=1, max_length=100_000)


class UpsertedOut(BaseModel):
    upserted: int


# The one rule for behaviour log-probs (posted groups, segments, slot fills and session groups all validate
# through TrajectoryIn): a log-probability is <= 0, up to a sampler's rounding, and not absurdly negative --
# e^-1e5 is never drawn (vLLM reports an impossible token as -9999); -3.4e38 made the trainer's float32
# metrics infinite.
LOGPROB_SLACK = 1e-3
LOGPROB_FLOOR = -1e5


def logprob_problem(v: float) -> str | None:
    """Why ``v`` is not a behaviour log-probability, or None when it is."""
    if LOGPROB_FLOOR <= v <= LOGPROB_SLACK:  # False for NaN
        return None
    return f"{v!r} is not a log-probability (between {LOGPROB_FLOOR:g} and 0, +{LOGPROB_SLACK:g} for rounding)"


def _logprob(v: float) -> float:
    problem = logprob_problem(v)
    if problem is not None:
        raise ValueError(problem)
    return v


LogProb = Annotated[float, AfterValidator(_logprob)]


def _checked_array(exact: Any, fits: Callable[[Any], bool], kinds: str) -> WrapValidator:
    """The validator of a token array annotated ``list[item]`` that must hold as ``list[exact]`` (e.g. ``list[float]``
    and ``list[LogProb]``), at C speed: pydantic-core's plain ``list[item]`` (strict, like every body here: no bools,
    no strings, no coercion) and one test of the whole list (``fits``: min / max, not one Python call or constraint
    per token) -- 3-7x faster than the per-item rule on a 1,024-token list. When either refuses, the per-item rule
    (``exact``) validates the list again and its errors are the ones reported: the same fields (``logprobs[5]``),
    messages and list of errors as validating with ``exact`` alone, which accepts every list the fast path does;
    constraints on the list itself (``Field(min_length=1)``) apply to ``list[item]`` and are reported when the items
    are fine. A 1-D numpy array of one of the dtype ``kinds`` (an Arrow body's column, ``service.ingest.arrow_body``)
    is tested by the same ``fits`` in numpy and kept as it is; any other array, or one that does not fit, is
    validated as its list by the per-item rule."""
    slow = TypeAdapter(list[exact], config=ConfigDict(strict=True, allow_inf_nan=False))

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if isinstance(value, np.ndarray):
            if value.ndim == 1 and value.dtype.kind in kinds and (not value.size or fits(value)):
                return value
            return slow.validate_python(value.tolist(), strict=True)  # the per-item errors (or its valid list)
        try:
            out = handler(value)
        except ValidationError:
            slow.validate_python(value, strict=True)  # the per-item errors, when an item is wrong
            raise  # else the list's own (not a list, min_length ...)
        if not out or fits(out):
            return out
        return slow.validate_python(value, strict=True)  # raises the per-item errors (or accepts: never here)

    return WrapValidator(validate)


def _bounds(values: Any) -> tuple[Any, Any]:
    if isinstance(values, np.ndarray):
        return values.min(), values.max()
    return min(values), max(values)


def _logprobs_fit(values: Any) -> bool:
    # the sum is NaN when one is (min / max may skip a NaN); allow_inf_nan=False refuses them before this anyway
    lo, hi = _bounds(values)
    total = values.sum() if isinstance(values, np.ndarray) else sum(values)
    return bool(LOGPROB_FLOOR <= lo and hi <= LOGPROB_SLACK and math.isfinite(total))


def _in(lo: int, hi: int) -> Callable[[Any], bool]:
    def fits(values: Any) -> bool:
        low, high = _bounds(values)
        return bool(lo <= low and high <= hi)

    return fits


def _bits_fit(values: Any) -> bool:
    if isinstance(values, np.ndarray):
        return bool(np.count_nonzero(values == 0) + np.count_nonzero(values == 1) == values.size)
    return values.count(1) + values.count(0) == len(values)  # two C scans (ints by now: no 1.0, no True)


MaskItem = Annotated[StrictInt, Field(ge=0, le=1)]  # StrictInt: no true/false
VersionItem = Annotated[StrictInt, Field(ge=-1, le=INT4_MAX)]
_INTEGERS, _FLOATS = "iu", "f"
TokenIds = Annotated[list[int], _checked_array(Int4, _in(0, INT4_MAX), _INTEGERS)]
LossMask = Annotated[list[int], _checked_array(MaskItem, _bits_fit, _INTEGERS)]
LogProbs = Annotated[list[float], _checked_array(LogProb, _logprobs_fit, _FLOATS)]
Versions = Annotated[list[int], _checked_array(VersionItem, _in(-1, INT4_MAX), _INTEGERS)]


def ones(mask: list[int] | np.ndarray) -> int:
    """The 1s of a checked loss mask (a list, or an Arrow body's uint8 array: no sum that wraps at 256)."""
    return int(np.count_nonzero(mask)) if isinstance(mask, np.ndarray) else sum(mask)


class SegmentIn(Strict):
    """One ordered segment of a segmented trajectory: its own sequence (prompt + response tokens)."""

    token_ids: TokenIds = Field(min_length=1)
    loss_mask: LossMask
    logprobs: LogProbs | None = None
    messages: list[Message] | None = Field(default=None, max_length=MAX_MESSAGES)

    @model_validator(mode="after")
    def _lengths(self) -> SegmentIn:
        n = len(self.token_ids)
        for name in ("loss_mask", "logprobs"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(f"{name}: length {len(v)} differs from token_ids length {n}")
        return self


MAX_SEGMENTS = 256


class TrajectoryIn(FreeJson):
    messages: list[Message] = Field(default_factory=list, max_length=MAX_MESSAGES)
    final_answer: str | None = None
    token_ids: TokenIds | None = None
    loss_mask: LossMask | None = None
    logprobs: LogProbs | None = None
    finish_reason: FinishReason
    num_tokens: Int4 | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    # ordered segments, each its own sequence (then no top-level token arrays); see docs/api.md
    segments: list[SegmentIn] | None = Field(default=None, max_length=MAX_SEGMENTS)

    @model_validator(mode="after")
    def _segments(self) -> TrajectoryIn:
        if self.segments is None:
            return self
        if not self.segments:
            raise ValueError("segments: an empty list; leave it out for an unsegmented trajectory")
        both = [k for k in ("token_ids", "loss_mask", "logprobs") if getattr(self, k) is not None]
        if both:
            raise ValueError(f"{both[0]}: a trajectory with segments carries its tokens in them, not at the top level")
        with_lp = [s.logprobs is not None for s in self.segments]
        if any(with_lp) and not all(with_lp):
            j = with_lp.index(False)
            raise ValueError(f"segments[{j}].logprobs: required when another segment has logprobs (all or none)")
        return self
    # the policy version that generated each token, -1 where the model did not (prompt, tool results); a
    # resumed episode mixes versions (docs/curation.md, "Resume")
    versions: Versions | None = None

    @model_validator(mode="after")
    def _lengths(self) -> TrajectoryIn:
        arrays = ("token_ids", "loss_mask", "logprobs", "versions")
        given = {k: len(v) for k in arrays if (v := getattr(self, k)) is not None}
        if len(set(given.values())) > 1:
            ref, n = next(iter(given.items()))
            bad = next(k for k, v in given.items() if v != n)
            raise ValueError(f"{bad}: length {given[bad]} differs from {ref} length {n}")
        if self.token_ids is None and (self.loss_mask is not None or self.logprobs is not None):
            raise ValueError("token_ids: required when loss_mask or logprobs is given")
        if self.token_ids is None and self.versions is not None:
            raise ValueError("token_ids: required when versions is given")
        if self.final_answer is None and not any(m.role == "assistant" for m in self.messages):
            raise ValueError("final_answer: required when there is no assistant message")
        return self

    def resolved_final_answer(self) -> str:
        if self.final_answer is not None:
            return self.final_answer
        for m in reversed(self.messages):
            if m.role == "assistant":
                return m.content if isinstance(m.content, str) else ""
        return ""

    def response_tokens(self) -> int:
        if self.num_tokens is not None:
            return self.num_tokens
        if self.segments is not None:
            return sum(ones(s.loss_mask) for s in self.segments)
        if self.loss_mask is not None:
            return ones(self.loss_mask)
        return len(self.token_ids) if self.token_ids is not None else 0

    def n_token_ids(self) -> int:
        """Every token id it carries, over all its segments."""
        if self.segments is not None:
            return sum(len(s.token_ids) for s in self.segments)
        return len(self.token_ids) if self.token_ids is not None else 0

    def flat_arrays(self) -> tuple[list[int] | None, list[int] | None, list[float] | None]:
        """(token_ids, loss_mask, logprobs), the segments' concatenated in order (as stored)."""
        if self.segments is None:
            return self.token_ids, self.loss_mask, self.logprobs
        lps = None if self.segments[0].logprobs is None else [x for s in self.segments for x in s.logprobs or ()]
        return ([x for s in self.segments for x in s.token_ids], [x for s in self.segments for x in s.loss_mask], lps)


class GroupIn(FreeJson):
    id: Key
    prompt_id: Key
    policy_version: Int4
    prompt: PromptIn | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    trajectories: list[TrajectoryIn] = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("sampling")
    @classmethod
    def _max_tokens(cls, v: dict[str, Any]) -> dict[str, Any]:
        mt = v.get("max_tokens")
        if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or not 0 < mt <= INT4_MAX):
            raise ValueError(f"sampling.max_tokens: must be an integer from 1 to {INT4_MAX}")
        temp = v.get("temperature")  # the trainer computes log-probs at this temperature
        if temp is not None and not _temperature_ok(temp):
            raise ValueError(
                f"sampling.temperature: must be a number from {TEMPERATURE_MIN:g} to {TEMPERATURE_MAX:g}"
                " (greedy decoding is not a temperature: send the temperature the log-probs were taken at)"
            )
        return v


# The trainer divides fp32 logits by the temperature: 1/T and logits/T must stay finite normal fp32
# numbers (a subnormal T makes 1/T inf and the loss NaN; T below ~1e-38 rounds to 0).
TEMPERATURE_MIN, TEMPERATURE_MAX = 1e-4, 1e4


def _temperature_ok(temp: object) -> bool:
    """A JSON number (not a bool) in [TEMPERATURE_MIN, TEMPERATURE_MAX]; an integer of any size compares
    exactly, so 10**400 is refused here instead of reaching the JSON encoder or the ::float8 cast."""
    if isinstance(temp, bool) or not isinstance(temp, int | float):
        return False
    return TEMPERATURE_MIN <= temp <= TEMPERATURE_MAX


class GroupsIn(Strict):
    groups: list[GroupIn] = Field(min_length=1)


class GroupAck(BaseModel):
    id: str
    status: str
    trajectories: int
    created: bool


class GroupsAck(BaseModel):
    groups: list[GroupAck]


class ComponentOut(BaseModel):
    value: float | None
    error: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    latency_ms: float | None = None


class TrajectoryOut(BaseModel):
    index: int
    finish_reason: str
    final_answer: str
    num_tokens: int
    num_turns: int
    messages: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None
    loss_mask: list[int] | None = None
    logprobs: list[float] | None = None
    versions: list[int] | None = None
    rewards: dict[str, ComponentOut] = Field(default_factory=dict)
    total_reward: float | None = None
    outcome: float | None = None
    advantage: float | None = None
    action: str | None = None
    reason: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    segments: list[SegmentOut] | None = Field(
        default=None, description="a segmented trajectory's ordered segments (then no top-level token arrays)")


class SegmentOut(BaseModel):
    segment_index: int
    is_last: bool
    seq_len: int = Field(description="its token ids (the arrays themselves only with include_tokens)")
    token_ids: list[int] | None = None
    loss_mask: list[int] | None = None
    logprobs: list[float] | None = None
    messages: list[dict[str, Any]] | None = None
    advantage: float | None = Field(None, description="this segment's share of the trajectory's advantage")


class DecisionOut(BaseModel):
    index: int | None
    action: str
    rule: str
    reason: str
    policy: str | None
    created_at: str


class ArchiveOut(BaseModel):
    """Where an archived group went (status ``archived``; its trajectories are in the file, not here)."""

    location: str
    archived_at: str
    final_status: str = Field(description="the status it had when it was archived")
    n_trajectories: int


class GroupOut(BaseModel):
    id: str
    prompt_id: str
    dataset: str
    policy_version: int
    status: str
    drop_reason: str | None
    sampling: dict[str, Any]
    metadata: dict[str, Any]
    reward_spec: str | None
    curation_policy: str | None
    score_error: str | None
    created_at: str
    lease_id: str | None = None
    staleness: int | None = None
    trajectories: list[TrajectoryOut]
    decisions: list[DecisionOut] = Field(default_factory=list)
    prompt_messages: list[dict[str, Any]] | None = Field(
        default=None, description="the prompt's messages (its reference is not shown); None: prompt unknown")
    archive: ArchiveOut | None = Field(default=None, description="set when status is 'archived'")


class GroupSummary(BaseModel):
    id: str
    prompt_id: str
    dataset: str
    policy_version: int
    status: str
    drop_reason: str | None
    n_trajectories: int
    n_tokens: int
    created_at: str
    mean_reward: float | None = Field(default=None, description="mean total reward of its scored members")


class GroupPage(BaseModel):
    groups: list[GroupSummary]
    next_cursor: str | None


