"""Small per-trajectory and per-group rules shared by the reference and the vectorised curation."""

from __future__ import annotations

import math

from filters.overlong import overlong_buffer_tokens, soft_overlong_penalty
from filters.types import (
    FINISH_REASONS,
    Action,
    CurationPolicy,
    GroupScore,
    TrajectoryScore,
    check_choice,
)

BASELINE_ACTIONS: tuple[str, ...] = ("keep", "mask", "penalize")


def is_stale(policy_version: int, current_policy_version: int | None, max_staleness: int | None) -> bool:
    """True when the group was sampled more than max_staleness versions behind the trainer.

    Off when either current_policy_version or max_staleness is None.
    """
    if current_policy_version is None or max_staleness is None:
        return False
    return current_policy_version - policy_version > max_staleness


def finish_reason_action(finish_reason: str, policy: CurationPolicy) -> Action:
    """The policy's action for a finish_reason; unknown reasons raise ValueError listing valid ones."""
    check_choice(finish_reason, FINISH_REASONS, "finish_reason")
    return policy.finish_reason_actions[finish_reason]


def resample_budget(max_tokens: int | None, multiplier: float) -> int | None:
    """The larger token budget asked for a resampled trajectory; None when max_tokens is unknown."""
    if max_tokens is None or max_tokens <= 0:
        return None
    return math.ceil(max_tokens * multiplier)


def overlong_penalty(num_tokens: int, max_tokens: int | None, policy: CurationPolicy) -> float:
    """Penalty added to a `penalize` member's reward: DAPO soft overlong when both lengths are known
    (num_tokens > 0, max_tokens > 0), otherwise the policy's fixed `penalty`."""
    if max_tokens is None or max_tokens <= 0 or num_tokens <= 0:
        return policy.penalty
    buffer = overlong_buffer_tokens(policy.overlong_buffer, max_tokens)
    return soft_overlong_penalty(num_tokens, max_tokens, buffer)


def check_finite(group: GroupScore, metric: str) -> None:
    """Raise ValueError when a total, outcome or the metric component (if one) is NaN or infinite.

    "Could not score" must be None, never NaN (DESIGN.md).
    """
    for t in group.trajectories:
        values = [t.total, t.outcome]
        if metric not in ("outcome", "total"):
            values.append(t.components.get(metric))
        for value in values:
            if value is not None and not math.isfinite(value):
                raise ValueError(
                    f"group {group.group_id!r} trajectory {t.index}: reward {value} is not finite; "
                    "an unscorable reward must be None"
                )


def check_component_present(group: GroupScore, candidates: list[TrajectoryScore], metric: str) -> None:
    """A component metric must exist in at least one baseline candidate, else ValueError."""
    if candidates and not any(metric in t.components for t in candidates):
        names = sorted({name for t in group.trajectories for name in t.components})
        raise ValueError(
            f"zero_variance metric {metric!r} is not a component of group {group.group_id!r}; "
            f"valid: outcome, total, {', '.join(names)}"
        )
