"""Plain data for curation: scored groups in, per-trajectory decisions out.

Everything here is a frozen dataclass over plain Python values so that `filters/` stays free of the
database, HTTP and torch. Choices are `Literal`s; every dataclass validates its names in
`__post_init__` and raises `ValueError` listing the valid ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, get_args

from filters.segments import check_segment_policy

# Why a trajectory ended, and whose doing it was (DESIGN.md, "finish_reason"):
# - the model's: stop (it answered), tool_misuse (it called a tool that does not exist or with arguments
#   the tool rejects: not JSON, against the schema) -- a failed outcome is a right negative;
# - a budget's: length, max_turns -- not a wrong answer (never taught as one);
# - the environment's: tool_failure (a tool failed on valid arguments), env_error, timeout, aborted --
#   never a negative and never in a baseline.
FinishReason = Literal[
    "stop", "length", "max_turns", "tool_misuse", "tool_failure", "env_error", "timeout", "aborted"
]
FINISH_REASONS: tuple[str, ...] = get_args(FinishReason)
MODEL_REASONS: frozenset[str] = frozenset({"stop", "tool_misuse"})
# The model's failures whose outcome is failed whatever it answered after (reward_models.spec.combine scores
# the outcome component 0): a tool misuse is never rewarded by a later right answer.
FAILED_OUTCOME_REASONS: frozenset[str] = frozenset({"tool_misuse"})
BUDGET_REASONS: frozenset[str] = frozenset({"length", "max_turns"})
ENVIRONMENT_REASONS: frozenset[str] = frozenset({"tool_failure", "env_error", "timeout", "aborted"})
# Older names still accepted on the wire (and in stored policies), read as their new name. `tool_error`
# meant "a tool failed" and was dropped like an environment failure; it could not tell a model's bad call
# from a broken tool, so it is read as the environment's `tool_failure` (migration 0008 renamed stored rows).
DEPRECATED_FINISH_REASONS: Mapping[str, str] = MappingProxyType({"tool_error": "tool_failure"})


def normalize_finish_reason(reason: object) -> object:
    """A deprecated finish_reason -> its current name; anything else unchanged (validated elsewhere)."""
    return DEPRECATED_FINISH_REASONS.get(reason, reason) if isinstance(reason, str) else reason

Action = Literal["keep", "drop", "mask", "penalize", "resample", "resume"]
ACTIONS: tuple[str, ...] = get_args(Action)
# The environment's failures are never a negative and never in a baseline: they are dropped, or sampled
# again. Any other action for an ENVIRONMENT_REASONS member is refused when the policy is made.
ENVIRONMENT_ACTIONS: tuple[str, ...] = ("drop", "resample")
# The remedies that fill a slot of the same group (docs/curation.md, "Remedies"); resume continues the
# episode from its checkpoint, so only a budget's cut (length, max_turns) may take it.
REMEDY_ACTIONS: tuple[str, ...] = ("resample", "resume")
# the actions whose members a trainer trains on (a lease delivers them; only their tokens make a group stale)
TRAINED_ACTIONS: tuple[str, ...] = ("keep", "penalize")
RESUME_REASONS: frozenset[str] = frozenset({"length", "max_turns"})

ZeroVarianceAction = Literal["drop", "keep"]
ZERO_VARIANCE_ACTIONS: tuple[str, ...] = get_args(ZeroVarianceAction)

Estimator = Literal["grpo", "dr_grpo", "rloo"]
ESTIMATOR_NAMES: tuple[str, ...] = get_args(Estimator)

StdKind = Literal["population", "unbiased"]
STD_KINDS: tuple[str, ...] = get_args(StdKind)

RewardErrorAction = Literal["drop", "drop_group"]
REWARD_ERROR_ACTIONS: tuple[str, ...] = get_args(RewardErrorAction)

GroupStatus = Literal["ready", "dropped"]

DropReason = Literal[
    "stale",
    "reward_error",
    "below_min_group_size",
    "no_trainable_members",
    "zero_variance",
    "pass_rate_band",
]
DROP_REASONS: tuple[str, ...] = get_args(DropReason)

# Budget cut-offs give no gradient and (unless the policy's masked_in_baseline) leave the group baseline;
# infrastructure failures are never negatives (see DESIGN.md, "finish_reason").
DEFAULT_FINISH_REASON_ACTIONS: Mapping[str, Action] = MappingProxyType(
    {
        "stop": "keep",
        "length": "mask",
        "max_turns": "mask",
        "tool_misuse": "keep",
        "tool_failure": "drop",
        "env_error": "drop",
        "timeout": "drop",
        "aborted": "drop",
    }
)

# Per-trajectory reasons besides the group drop reasons above.
REASON_OK = "ok"
REASON_REWARD_ERROR = "reward_error"
REASON_ZERO_VARIANCE = "zero_variance"
REASON_STALE = "stale"


def finish_reason_reason(finish_reason: str) -> str:
    """The reason recorded when a trajectory's action comes from its finish_reason."""
    return f"finish_reason:{finish_reason}"


def check_choice(value: str, valid: Iterable[str], what: str) -> None:
    """Raise `ValueError` naming `what` and listing the valid names when `value` is not one."""
    valid = tuple(valid)
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")


def check_environment_action(reason: str, action: str) -> None:
    """ValueError unless `action` is one an environment failure may take (ENVIRONMENT_ACTIONS)."""
    if action not in ENVIRONMENT_ACTIONS:
        raise ValueError(
            f"finish_reason {reason!r} is the environment's failure, never a negative nor in a baseline: "
            f"action {action!r} is not allowed; valid: {', '.join(ENVIRONMENT_ACTIONS)}"
        )


def check_resume_action(reason: str, action: str) -> None:
    """ValueError when `resume` is asked for a reason that is not a budget's cut (RESUME_REASONS)."""
    if action == "resume" and reason not in RESUME_REASONS:
        raise ValueError(
            f"finish_reason {reason!r}: action 'resume' continues an episode cut by a budget; it is valid "
            f"only for {', '.join(sorted(RESUME_REASONS))}"
        )


def actions_for(reason: str) -> tuple[str, ...]:
    """The actions a policy may give `reason`: the environment's take ENVIRONMENT_ACTIONS, resume only
    RESUME_REASONS."""
    if reason in ENVIRONMENT_REASONS:
        return ENVIRONMENT_ACTIONS
    return tuple(a for a in ACTIONS if a != "resume" or reason in RESUME_REASONS)


def merge_finish_reason_actions(overrides: Mapping[str, str] | None) -> Mapping[str, Action]:
    """Defaults merged with user overrides, validated; returns a read-only mapping over all reasons."""
    merged: dict[str, Action] = dict(DEFAULT_FINISH_REASON_ACTIONS)
    for reason, action in (overrides or {}).items():
        reason = str(normalize_finish_reason(reason))
        check_choice(reason, FINISH_REASONS, "finish_reason")
        check_choice(action, ACTIONS, f"action for finish_reason {reason!r}")
        if reason in ENVIRONMENT_REASONS:
            check_environment_action(reason, action)
        check_resume_action(reason, action)
        merged[reason] = action  # type: ignore[assignment]
    return MappingProxyType(merged)


@dataclass(frozen=True)
class ZeroVariance:
    """Zero-variance (no-signal) detection, DAPO dynamic sampling (Yu et al. 2025).

    metric: "outcome" (default; falls back to "total" for a group none of whose members has an outcome),
        "total" (the reward used for advantages, overlong penalty included) or a component name.
    eps: a group whose metric has population std <= eps has no signal.
    action: "drop" the group, or "keep" it with every advantage 0.
    pass_rate_band: optional (low, high); groups whose outcome mean is outside it are dropped.
    """

    metric: str = "outcome"
    eps: float = 1e-6
    action: ZeroVarianceAction = "drop"
    pass_rate_band: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        check_choice(self.action, ZERO_VARIANCE_ACTIONS, "zero_variance action")
        if not self.metric:
            raise ValueError("zero_variance metric must be a non-empty name")
        if not self.eps >= 0:
            raise ValueError(f"zero_variance eps must be >= 0, got {self.eps}")
        if self.pass_rate_band is not None:
            low, high = self.pass_rate_band
            if not low <= high:
                raise ValueError(f"pass_rate_band needs low <= high, got {self.pass_rate_band}")


@dataclass(frozen=True)
class AdvantageConfig:
    """Group-relative advantage estimator; see `filters.advantages` for the formulas."""

    estimator: Estimator = "grpo"
    std: StdKind = "population"
    eps: float = 1e-6

    def __post_init__(self) -> None:
        check_choice(self.estimator, ESTIMATOR_NAMES, "advantage estimator")
        check_choice(self.std, STD_KINDS, "std kind")
        if not self.eps >= 0:
            raise ValueError(f"advantage eps must be >= 0, got {self.eps}")


@dataclass(frozen=True)
class CurriculumConfig:
    """Refill priority: prompts whose last `k` groups were all solved / all failed get `low_priority`."""

    k: int = 3
    solved: float = 1.0
    failed: float = 0.0
    low_priority: float = 0.1

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"curriculum k must be >= 1, got {self.k}")
        if not self.failed < self.solved:
            raise ValueError(f"curriculum needs failed < solved, got {self.failed}, {self.solved}")
        if not 0.0 <= self.low_priority <= 1.0:
            raise ValueError(f"curriculum low_priority must be in [0, 1], got {self.low_priority}")


@dataclass(frozen=True)
class CurationPolicy:
    """A curation policy (dynamic-sampling policy), attached per dataset or prompt.

    finish_reason_actions: user overrides merged over `DEFAULT_FINISH_REASON_ACTIONS`.
    max_staleness: a group sampled more than this many policy versions behind the trainer is dropped
        ("stale"); None turns the check off.
    min_group_size: groups with fewer baseline members (keep + penalize, + mask with masked_in_baseline)
        are dropped.
    overlong_buffer: DAPO's overlong buffer L_cache for `penalize` and `soft_overlong`; a value in (0, 1)
        is a fraction of the group's max_tokens (at least one token), a whole number >= 1 is a token
        count, 0 is a hard cut-off.
    soft_overlong: DAPO's overlong reward shaping: every baseline member's reward gets the soft
        overlong penalty by its num_tokens, truncated or not (`penalize` alone shapes only the members
        whose finish_reason maps to it; a `length` member then always gets exactly -1).
    penalty: added to the reward of a `penalize` member when max_tokens or num_tokens is unknown.
    resample_budget_multiplier: the new budget asked for a `resample` member (x the group max_tokens).
    reward_error: a member whose reward is None is dropped ("drop") or takes its group down
        ("drop_group"); it is never used as a negative.
    masked_in_baseline: False (default): a `mask` member (cut by a budget) takes no part in the group's
        mean, std, zero-variance and pass-rate statistics, like a dropped one, so a truncation never
        gives the completers signal. True: DAPO's published overlong filtering (Yu et al. 2025, §3.4):
        the loss is masked but the member stays in the group statistics at its raw reward.
    segment_advantage / segment_discount: how a segmented trajectory's advantage is assigned to its
        segments (`filters.segments`): broadcast (default), divide (A / K) or discount (A * gamma^(K-1-k)).
    resample_wait_seconds: how long a group with `resample` / `resume` members waits (status `waiting`)
        for producers to fill those slots before it trains with what it has; 0: no wait (the group trains
        without them at once and a fresh group of the prompt is asked for, the pre-0010 behaviour).
    max_resumes: how many times one slot may be resumed; a member cut again after that keeps its action
        `resume` and, like a resample member whose slot was not filled, stays out of training and out of
        the group's baseline (advantage 0, no reward used), whatever `masked_in_baseline` says.
    """

    zero_variance: ZeroVariance = field(default_factory=ZeroVariance)
    finish_reason_actions: Mapping[str, Action] = field(default_factory=dict)
    max_staleness: int | None = None
    min_group_size: int = 2
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    overlong_buffer: float = 0.2
    penalty: float = -1.0
    resample_budget_multiplier: float = 2.0
    reward_error: RewardErrorAction = "drop"
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    soft_overlong: bool = False
    masked_in_baseline: bool = False
    segment_advantage: str = "broadcast"
    segment_discount: float = 0.9
    resample_wait_seconds: float = 300.0
    max_resumes: int = 2

    def __post_init__(self) -> None:
        merged = merge_finish_reason_actions(self.finish_reason_actions)
        object.__setattr__(self, "finish_reason_actions", merged)
        check_choice(self.reward_error, REWARD_ERROR_ACTIONS, "reward_error action")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {self.max_staleness}")
        if self.min_group_size < 1:
            raise ValueError(f"min_group_size must be >= 1, got {self.min_group_size}")
        buffer = self.overlong_buffer
        if not (buffer >= 0 and (buffer < 1 or float(buffer).is_integer())):
            raise ValueError(
                f"overlong_buffer must be a fraction in [0, 1) or a whole token count, got {buffer}"
            )
        check_segment_policy(self.segment_advantage, self.segment_discount)
        if not self.resample_wait_seconds >= 0:
            raise ValueError(f"resample_wait_seconds must be >= 0, got {self.resample_wait_seconds}")
        if self.max_resumes < 0:
            raise ValueError(f"max_resumes must be >= 0, got {self.max_resumes}")
        if not self.resample_budget_multiplier >= 1:
            raise ValueError(
                f"resample_budget_multiplier must be >= 1, got {self.resample_budget_multiplier}"
            )


@dataclass(frozen=True)
class TrajectoryScore:
    """One scored trajectory. `total` / `outcome` / component values are None when not computable.

    num_tokens: generated tokens; 0 means unknown. num_turns: model turns (the group's max_tokens is a
    per-turn budget: the producer samples every turn with it). max_tokens: the member's own budget (see
    the field), which its length is shaped against.
    """

    index: int
    finish_reason: str
    total: float | None
    components: Mapping[str, float | None]
    outcome: float | None
    num_tokens: int = 0
    num_turns: int = 1
    # the member's own per-turn budget when it differs from the group's (a replacement sampled at the larger
    # budget its resample / resume request asked for); None: the group's max_tokens
    max_tokens: int | None = None
    segments: int = 0  # K ordered segments (0: not segmented)
    # of them, those the trainer trains on (a mask-1 target); None: all K. `divide`'s K (filters.segments)
    trained_segments: int | None = None


@dataclass(frozen=True)
class GroupScore:
    """A scored group: G trajectories sampled for one prompt by policy `policy_version` (for staleness the
    oldest version that generated any of its tokens: a replacement or resumed member may be older)."""

    group_id: str
    policy_version: int
    trajectories: Sequence[TrajectoryScore]
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class TrajectoryDecision:
    """What curation decided for one trajectory.

    advantage: 0 unless the action is keep / penalize in a ready group.
    reward_used: the reward this member puts in the group baseline (total, plus the overlong penalty
        for penalize); None for members outside the baseline (dropped, resampled, stale, no reward, and
        masked unless the policy's masked_in_baseline).
    """

    index: int
    action: Action
    reason: str
    advantage: float
    reward_used: float | None
    segment_advantages: tuple[float, ...] = ()  # one per segment of a segmented trajectory (filters.segments)


@dataclass(frozen=True)
class GroupDecision:
    """What curation decided for one group.

    metric_std: population std of the zero-variance metric over the baseline members (None if none).
    resample: indices whose action is resample; resample_max_tokens: the larger budget to ask for
        (None when the group's max_tokens is unknown or nothing is resampled).
    outcome_mean: mean outcome (total when the group has no outcome) over the baseline members;
        the per-group pass rate the curriculum tracks.
    """

    group_id: str
    status: GroupStatus
    drop_reason: str | None
    trajectories: tuple[TrajectoryDecision, ...]
    metric_std: float | None
    resample: tuple[int, ...]
    resample_max_tokens: int | None = None
    outcome_mean: float | None = None
