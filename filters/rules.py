"""Small per-trajectory and per-group rules shared by the reference and the vectorised curation."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from filters.overlong import buffer_tokens, soft_overlong_penalties
from filters.types import (
    BUDGET_REASONS,
    FINISH_REASONS,
    TRAINED_ACTIONS,
    Action,
    CurationPolicy,
    GroupScore,
    TrajectoryScore,
    check_choice,
)

# Members a group keeps (a dropped group takes them down with its reason); of them, the baseline members
# enter the group statistics: mask members only with the policy's masked_in_baseline.
MEMBER_ACTIONS: tuple[str, ...] = ("keep", "mask", "penalize")


def baseline_actions(policy: CurationPolicy) -> tuple[str, ...]:
    """The actions whose members enter the group's mean, std, zero-variance and pass-rate statistics.

    keep and penalize always; mask only with `policy.masked_in_baseline` (DAPO's overlong filtering keeps
    the cut member in the group; by default a cut member leaves it, so a truncation never makes signal).
    The one rule for both the per-group reference and the vectorised path.
    """
    return MEMBER_ACTIONS if policy.masked_in_baseline else TRAINED_ACTIONS


def is_stale(policy_version: int, current_policy_version: int | None, max_staleness: int | None) -> bool:
    """True when the group was sampled more than max_staleness versions behind the trainer.

    Off when either current_policy_version or max_staleness is None.
    """
    if current_policy_version is None or max_staleness is None:
        return False
    return current_policy_version - policy_version > max_staleness


def staleness_version(versions: Iterable[Iterable[int] | None], policy_version: int) -> int:
    """The version a group's staleness is measured from: its oldest generated token's. ``versions`` are its
    trajectories' per-token policy versions (-1: not generated; None: every generated token is the
    group's ``policy_version``), so a member filled by an older policy, or tokens an earlier policy
    generated, make the group as stale as they are. The one rule for ingest, curation, delivery and the
    trainer's logged staleness."""
    oldest = policy_version
    for vs in versions:
        if isinstance(vs, np.ndarray):  # an Arrow body's array (service.ingest.arrow_body): the same rule in numpy
            older = vs[(vs >= 0) & (vs < policy_version)]
            oldest = min(oldest, int(older.min())) if older.size else oldest
        elif vs is not None:
            oldest = min(oldest, min((v for v in vs if 0 <= v < policy_version), default=oldest))
    return oldest


def finish_reason_action(finish_reason: str, policy: CurationPolicy) -> Action:
    """The policy's action for a finish_reason; unknown reasons raise ValueError listing valid ones."""
    check_choice(finish_reason, FINISH_REASONS, "finish_reason")
    return policy.finish_reason_actions[finish_reason]


def resample_budget(max_tokens: int | None, multiplier: float) -> int | None:
    """The larger token budget asked for a resampled trajectory; None when max_tokens is unknown."""
    if max_tokens is None or max_tokens <= 0:
        return None
    return math.ceil(max_tokens * multiplier)


def overlong_penalties(
    num_tokens: np.ndarray,
    max_tokens: np.ndarray,
    penalize: np.ndarray,
    policy: CurationPolicy,
    num_turns: np.ndarray | None = None,
    masked: np.ndarray | None = None,
    cut: np.ndarray | None = None,
) -> np.ndarray:
    """Overlong penalty added to the reward of baseline members: (N,) x3 -> (N,) floats.

    num_tokens, max_tokens (N,) ints (max_tokens <= 0: the group's budget is unknown); penalize (N,)
    bool, the members whose finish_reason action is `penalize`. A member is shaped when it is a
    `penalize` member or `policy.soft_overlong` is on (every member, truncated or not: DAPO's overlong
    reward shaping). A shaped member with known lengths (both > 0) gets the DAPO soft overlong penalty;
    with an unknown length a `penalize` member gets the policy's fixed `penalty`, any other member 0.

    max_tokens is a per-model-turn budget (the producer samples each turn with it), and num_tokens counts
    every turn. `soft_overlong` therefore shapes only single-turn members whose length fits the budget;
    a multi-turn member (num_turns (N,) > 1), or one longer than the budget that was not cut by it, is
    left unshaped (0): its turns' lengths are not known here, and shaping its total would teach the
    policy to stop calling tools. A `penalize` member (its last turn was cut) is shaped as before.
    A `mask` member (masked (N,) bool) is never shaped: masking a cut means not punishing it, so with
    masked_in_baseline it enters the baseline at its raw reward, never at the ramp's -1.
    A `penalize` member cut by a budget (cut (N,) bool: finish_reason length / max_turns) reached that budget
    whatever token count it was posted with (a context window, a turn limit, a count that excludes
    something): it gets the full -1 (the policy's `penalty` when the budget is unknown), never 0 for being
    short -- penalizing a cut exactly means training it as the worst outcome.
    """
    n = np.asarray(num_tokens, dtype=np.int64)
    m = np.asarray(max_tokens, dtype=np.int64)
    pen = np.asarray(penalize, dtype=bool)
    if cut is not None:
        n = np.where(pen & np.asarray(cut, dtype=bool) & (n > 0), np.maximum(n, m), n)
    known = (m > 0) & (n > 0)
    safe_m = np.where(known, m, 1)
    soft = soft_overlong_penalties(n, safe_m, buffer_tokens(policy.overlong_buffer, safe_m))
    turns = np.ones(n.shape, dtype=np.int64) if num_turns is None else np.asarray(num_turns, dtype=np.int64)
    soft_ok = policy.soft_overlong & (turns <= 1) & (n <= m)
    if masked is not None:
        soft_ok = soft_ok & ~np.asarray(masked, dtype=bool)
    shaped = pen | soft_ok
    return np.where(shaped, np.where(known, soft, np.where(pen, policy.penalty, 0.0)), 0.0)


def overlong_penalty(
    num_tokens: int, max_tokens: int | None, action: str, policy: CurationPolicy, num_turns: int = 1,
    finish_reason: str = "stop",
) -> float:
    """`overlong_penalties` for one baseline member of `action` (max_tokens None: unknown)."""
    one = overlong_penalties(
        np.array([num_tokens]),
        np.array([max_tokens or 0]),
        np.array([action == "penalize"]),
        policy,
        np.array([num_turns]),
        np.array([action == "mask"]),
        np.array([finish_reason in BUDGET_REASONS]),
    )
    return float(one[0])


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
