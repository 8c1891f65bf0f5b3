"""The API schema of a curation policy (`POST /v1/curation-policies`) and its conversion to the plain
`CurationPolicy` that the curation functions take. Unknown fields are rejected; every error names the
field it is about (pydantic's `loc`).
"""

from __future__ import annotations

from typing import Annotated, Self, cast

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, field_validator, model_validator

from filters.segments import DEFAULT_SEGMENT_DISCOUNT, SegmentAdvantage
from filters.types import (
    ENVIRONMENT_REASONS,
    Action,
    AdvantageConfig,
    CurationPolicy,
    CurriculumConfig,
    Estimator,
    FinishReason,
    RewardErrorAction,
    StdKind,
    ZeroVariance,
    ZeroVarianceAction,
    check_environment_action,
    check_resume_action,
    normalize_finish_reason,
)

_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True, strict=True)
# Every float has an upper bound, so no product or sum of them (with rewards, token counts) overflows.
MAX_MAGNITUDE = 1e6  # eps, penalty, curriculum thresholds
MAX_RESAMPLE_MULTIPLIER = 16.0
MAX_OVERLONG_TOKENS = 2**31 - 1  # a token count (an int4 max_tokens)
MAX_WAIT_SECONDS = 7 * 86_400.0  # a remedy slot is awaited at most a week
MAX_RESUMES = 16
PassRate = Annotated[StrictFloat, Field(ge=0, le=1)]


class ZeroVarianceSpec(BaseModel):
    """Wire form of `ZeroVariance`."""

    model_config = _CONFIG

    metric: str = Field(default="outcome", min_length=1, max_length=128)
    eps: float = Field(default=1e-6, ge=0, le=MAX_MAGNITUDE)
    action: ZeroVarianceAction = "drop"
    # strict=False: JSON has no tuples, so a list is the wire form of the pair (each still a number)
    pass_rate_band: tuple[PassRate, PassRate] | None = Field(default=None, strict=False)

    @field_validator("pass_rate_band")
    @classmethod
    def _band_ordered(cls, band: tuple[float, float] | None) -> tuple[float, float] | None:
        if band is not None and not band[0] <= band[1]:
            raise ValueError(f"needs low <= high, got {list(band)}")
        return band


class AdvantageSpec(BaseModel):
    """Wire form of `AdvantageConfig`."""

    model_config = _CONFIG

    estimator: Estimator = "grpo"
    std: StdKind = "population"
    eps: float = Field(default=1e-6, ge=0, le=MAX_MAGNITUDE)


class CurriculumSpec(BaseModel):
    """Wire form of `CurriculumConfig`."""

    model_config = _CONFIG

    k: int = Field(default=3, ge=1)
    solved: float = Field(default=1.0, ge=-MAX_MAGNITUDE, le=MAX_MAGNITUDE)
    failed: float = Field(default=0.0, ge=-MAX_MAGNITUDE, le=MAX_MAGNITUDE)
    low_priority: float = Field(default=0.1, ge=0, le=1)

    @model_validator(mode="after")
    def _failed_below_solved(self) -> Self:
        if not self.failed < self.solved:
            raise ValueError(f"failed must be < solved, got failed={self.failed}, solved={self.solved}")
        return self


class CurationPolicySpec(BaseModel):
    """`POST /v1/curation-policies` body (DESIGN.md, API v1); `.to_policy()` gives the plain policy.

    finish_reason_actions lists overrides only; the rest keep their defaults
    (stop, tool_misuse keep; length, max_turns mask; tool_failure, env_error, timeout, aborted drop;
    the old name tool_error is read as tool_failure).
    overlong_buffer: a fraction in [0, 1) of the group's max_tokens, or a whole token count >= 1.
    soft_overlong: DAPO's overlong reward shaping on every member by its length (see `CurationPolicy`).
    masked_in_baseline: false (default): a `mask` member leaves the group statistics; true: DAPO's.
    segment_advantage: broadcast (default) | divide | discount, with segment_discount (gamma in (0, 1]):
    how a segmented trajectory's advantage is given to its segments (`filters.segments`).
    The environment's reasons (tool_failure, env_error, timeout, aborted) take only drop or resample;
    resume only length / max_turns. resample_wait_seconds: how long a group waits for its resample /
    resume slots (0: no wait, a fresh group is asked for instead); max_resumes: resumes per slot.
    """

    model_config = _CONFIG

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    zero_variance: ZeroVarianceSpec = ZeroVarianceSpec()
    finish_reason_actions: dict[FinishReason, Action] = Field(default_factory=dict)
    # policy versions are int4, so any bound beyond that means 'never stale'; the stale-drop SQL compares
    # in numeric, and the wire refuses integers beyond 64 bits anyway
    max_staleness: int | None = Field(default=None, ge=0, le=2**63 - 1)
    min_group_size: int = Field(default=2, ge=1)
    advantage: AdvantageSpec = AdvantageSpec()
    overlong_buffer: float = Field(default=0.2, ge=0, le=MAX_OVERLONG_TOKENS)
    penalty: float = Field(default=-1.0, ge=-MAX_MAGNITUDE, le=MAX_MAGNITUDE)
    resample_budget_multiplier: float = Field(default=2.0, ge=1, le=MAX_RESAMPLE_MULTIPLIER)
    reward_error: RewardErrorAction = "drop"
    curriculum: CurriculumSpec = CurriculumSpec()
    soft_overlong: bool = Field(default=False, strict=True)
    masked_in_baseline: bool = Field(default=False, strict=True)
    segment_advantage: SegmentAdvantage = "broadcast"
    segment_discount: float = Field(default=DEFAULT_SEGMENT_DISCOUNT, gt=0, le=1)
    resample_wait_seconds: float = Field(default=300.0, ge=0, le=MAX_WAIT_SECONDS)
    max_resumes: int = Field(default=2, ge=0, le=MAX_RESUMES)

    @field_validator("finish_reason_actions")
    @classmethod
    def _environment_never_a_negative(cls, actions: dict[str, str]) -> dict[str, str]:
        """An environment failure is dropped or sampled again: never a negative, never in a baseline."""
        for reason, action in actions.items():
            if reason in ENVIRONMENT_REASONS:
                check_environment_action(reason, action)
            check_resume_action(reason, action)
        return actions

    @field_validator("finish_reason_actions", mode="before")
    @classmethod
    def _current_reason_names(cls, actions: object) -> object:
        """Deprecated reason names (tool_error) are read as their current one; both at once must agree."""
        if not isinstance(actions, dict):
            return actions
        out: dict[object, object] = {}
        for reason, action in actions.items():
            name = normalize_finish_reason(reason)
            if name in out and out[name] != action:
                old = next(k for k in actions if k != name and normalize_finish_reason(k) == name)
                raise ValueError(f"{old!r} is the old name of {name!r}; they are given different actions")
            out[name] = action
        return out

    @field_validator("overlong_buffer")
    @classmethod
    def _buffer_fraction_or_tokens(cls, buffer: float) -> float:
        if not (buffer < 1 or buffer.is_integer()):
            raise ValueError(f"must be a fraction in [0, 1) or a whole token count, got {buffer}")
        return buffer

    def to_policy(self) -> CurationPolicy:
        """The plain, validated `CurationPolicy` (defaults merged into finish_reason_actions)."""
        zv = self.zero_variance
        return CurationPolicy(
            zero_variance=ZeroVariance(zv.metric, zv.eps, zv.action, zv.pass_rate_band),
            finish_reason_actions={str(k): v for k, v in self.finish_reason_actions.items()},
            max_staleness=self.max_staleness,
            min_group_size=self.min_group_size,
            advantage=AdvantageConfig(**self.advantage.model_dump()),
            overlong_buffer=self.overlong_buffer,
            penalty=self.penalty,
            resample_budget_multiplier=self.resample_budget_multiplier,
            reward_error=self.reward_error,
            curriculum=CurriculumConfig(**self.curriculum.model_dump()),
            soft_overlong=self.soft_overlong,
            masked_in_baseline=self.masked_in_baseline,
            segment_advantage=self.segment_advantage,
            segment_discount=self.segment_discount,
            resample_wait_seconds=self.resample_wait_seconds,
            max_resumes=self.max_resumes,
        )

    @classmethod
    def from_policy(cls, name: str, policy: CurationPolicy) -> CurationPolicySpec:
        """The wire form of a plain policy (finish_reason_actions in full), e.g. to return it."""
        zv = policy.zero_variance
        return cls(
            name=name,
            zero_variance=ZeroVarianceSpec(
                metric=zv.metric, eps=zv.eps, action=zv.action, pass_rate_band=zv.pass_rate_band
            ),
            finish_reason_actions=cast(dict[FinishReason, Action], dict(policy.finish_reason_actions)),
            max_staleness=policy.max_staleness,
            min_group_size=policy.min_group_size,
            advantage=AdvantageSpec(
                estimator=policy.advantage.estimator, std=policy.advantage.std, eps=policy.advantage.eps
            ),
            overlong_buffer=policy.overlong_buffer,
            penalty=policy.penalty,
            resample_budget_multiplier=policy.resample_budget_multiplier,
            reward_error=policy.reward_error,
            curriculum=CurriculumSpec(
                k=policy.curriculum.k,
                solved=policy.curriculum.solved,
                failed=policy.curriculum.failed,
                low_priority=policy.curriculum.low_priority,
            ),
            soft_overlong=policy.soft_overlong,
            masked_in_baseline=policy.masked_in_baseline,
            segment_advantage=cast(SegmentAdvantage, policy.segment_advantage),
            segment_discount=policy.segment_discount,
            resample_wait_seconds=policy.resample_wait_seconds,
            max_resumes=policy.max_resumes,
        )
