"""Curation of scored groups: per trajectory an action, a reason and an advantage.

`curate_group` is the plain per-group reference; `curate_groups` is the vectorised path over many
groups (numpy, padded (B, G)) and returns the same decisions. Steps, in order:

1. NaN / infinite total, outcome or metric component -> ValueError (unscorable must be None).
2. Staleness: current_policy_version - policy_version > max_staleness -> group dropped "stale".
3. finish_reason -> action (policy.finish_reason_actions):
   keep     normal member;
   mask     advantage 0 (no gradient) and, by default, outside the baseline: its reward takes no part in
            the mean, std, leave-one-out means, zero-variance check or pass rate, so a truncated member
            never gives the completers signal. With `policy.masked_in_baseline` (DAPO's overlong
            filtering) it stays in the baseline at its raw reward (never overlong-shaped);
   penalize normal member whose reward is total + DAPO soft overlong penalty (`rules.overlong_penalties`);
            a `length` member was cut at the budget (num_tokens == max_tokens), so the ramp gives it
            exactly -1: for `length`, penalize is a fixed truncation penalty, not DAPO's shaping;
   drop     removed from the group (not in the baseline);
   resample removed like drop, and listed in `GroupDecision.resample` with a larger budget.
   Baseline candidates are the keep / penalize members (and mask with masked_in_baseline:
   `rules.baseline_actions`, the one rule both paths use). With `policy.soft_overlong` every keep /
   penalize member's reward gets the DAPO soft overlong penalty by its num_tokens, truncated or not
   (DAPO's overlong reward shaping: answers that stop inside the buffer zone are shaped too).
4. Reward errors: a candidate whose total is None, or whose metric value (outcome, component) is None
   is dropped with reason "reward_error" -- never a negative. With policy.reward_error "drop_group"
   the whole group is dropped "reward_error" instead.
5. Group checks on the remaining baseline members, first that applies wins:
   "below_min_group_size" (baseline members < min_group_size), "no_trainable_members" (all
   masked; only reachable with masked_in_baseline), "zero_variance" (population std of the metric <= eps; action drop, or keep with every
   advantage 0 and reason "zero_variance"), "pass_rate_band" (outcome mean outside [low, high]).
6. Advantages over the baseline (estimator from policy.advantage); masked members get 0.

Metric: "outcome" uses the outcome values; a group none of whose candidates has an outcome falls back
to "total". "total" means the reward used for advantages (penalty included), since zero variance is
about advantage signal. A component name uses that component's raw value. `outcome_mean` (the pass
rate, also what pass_rate_band checks) is the mean outcome over the baseline members that have one,
or the mean raw total when the group has no outcome.
In a dropped group, baseline and mask members become "drop" with the group's reason; members dropped earlier
keep their own reason. Resampled members keep "resample" whatever the group status (the prompt needs
a larger budget either way), except in stale groups where every member is dropped "stale".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from filters.advantages import compute_advantages
from filters.batched import curate_groups_batched
from filters.rules import (
    baseline_actions,
    check_component_present,
    check_finite,
    finish_reason_action,
    is_stale,
    overlong_penalty,
    resample_budget,
)
from filters.segments import with_segment_advantages
from filters.types import (
    REASON_OK,
    REASON_REWARD_ERROR,
    REASON_STALE,
    REASON_ZERO_VARIANCE,
    Action,
    CurationPolicy,
    GroupDecision,
    GroupScore,
    GroupStatus,
    TrajectoryDecision,
    TrajectoryScore,
    finish_reason_reason,
)


def _metric_value(t: TrajectoryScore, metric: str, used: float, action: Action) -> float | None:
    """The zero-variance metric of one member; `metric` is already resolved (no outcome fallback). A
    `penalize` member's carries its penalty (``used - total``) whatever the metric: penalizing a cut trains
    it as a failure, so [correct, correct, cut] is not zero-variance because the cut one happened to reach
    the right outcome before the budget (the outcome metric alone would drop the group, penalty unseen)."""
    if metric == "total":
        return used
    raw = t.outcome if metric == "outcome" else t.components.get(metric)
    if action == "penalize" and raw is not None:
        return raw + (used - t.total)  # type: ignore[operator]  # a baseline member has a total
    return raw


def _resolve_metric(
    group: GroupScore, candidates: list[TrajectoryScore], policy: CurationPolicy
) -> tuple[str, bool]:
    """(metric actually used, whether the group has an outcome) for the baseline candidates."""
    has_outcome = any(t.outcome is not None for t in candidates)
    metric = policy.zero_variance.metric
    if metric == "outcome":
        return ("outcome" if has_outcome else "total"), has_outcome
    if metric != "total":
        check_component_present(group, candidates, metric)
    return metric, has_outcome


def _reward_missing(t: TrajectoryScore, metric: str, needs_outcome: bool) -> bool:
    """True when a candidate lacks a reward this policy needs (total, outcome or the component)."""
    if t.total is None or (needs_outcome and t.outcome is None):
        return True
    return metric not in ("total", "outcome") and t.components.get(metric) is None


def _group_drop_reason(
    members: dict[int, Action], metric_std: float | None, outcome_mean: float | None, policy: CurationPolicy
) -> str | None:
    """Step 5: the group's drop reason given its baseline members (index -> action), or None."""
    if len(members) < policy.min_group_size:
        return "below_min_group_size"
    if all(a == "mask" for a in members.values()):
        return "no_trainable_members"
    zv = policy.zero_variance
    if metric_std is not None and metric_std <= zv.eps and zv.action == "drop":
        return "zero_variance"
    band = zv.pass_rate_band
    if band is not None and outcome_mean is not None and not band[0] <= outcome_mean <= band[1]:
        return "pass_rate_band"
    return None


def _stale_decision(group: GroupScore) -> GroupDecision:
    """Every member dropped "stale"."""
    trajectories = tuple(
        TrajectoryDecision(t.index, "drop", REASON_STALE, 0.0, None) for t in group.trajectories
    )
    return GroupDecision(group.group_id, "dropped", "stale", trajectories, None, ())


def _baseline(
    group: GroupScore, actions: list[Action], policy: CurationPolicy
) -> tuple[dict[int, float], set[int], str, bool]:
    """Steps 3-4: (position -> reward used, positions with reward errors, metric, has_outcome)."""
    trajs = group.trajectories
    in_baseline = baseline_actions(policy)
    candidates = [i for i, a in enumerate(actions) if a in in_baseline]
    metric, has_outcome = _resolve_metric(group, [trajs[i] for i in candidates], policy)
    needs_outcome = has_outcome and (metric == "outcome" or policy.zero_variance.pass_rate_band is not None)
    errors = {i for i in candidates if _reward_missing(trajs[i], metric, needs_outcome)}
    used: dict[int, float] = {}
    for i in candidates:
        if i in errors:
            continue
        total = float(trajs[i].total)  # type: ignore[arg-type]
        budget = trajs[i].max_tokens or group.max_tokens  # a replacement's own (larger) budget
        used[i] = total + overlong_penalty(
            trajs[i].num_tokens, budget, actions[i], policy, trajs[i].num_turns, trajs[i].finish_reason
        )
    return used, errors, metric, has_outcome


def _stats(
    group: GroupScore, used: dict[int, float], metric: str, has_outcome: bool, actions: list[Action]
) -> tuple[float | None, float | None]:
    """(population std of the metric, outcome mean) over the baseline members; None when empty.

    The outcome mean skips members without an outcome (possible when the policy does not need it).
    """
    if not used:
        return None, None
    trajs = group.trajectories
    values = [_metric_value(trajs[i], metric, u, actions[i]) for i, u in used.items()]
    outcomes = [trajs[i].outcome if has_outcome else trajs[i].total for i in used]
    known = [o for o in outcomes if o is not None]
    mean = float(np.mean(known)) if known else None
    return float(np.std(np.array(values, dtype=np.float64))), mean


def curate_group(
    group: GroupScore, policy: CurationPolicy, current_policy_version: int | None
) -> GroupDecision:
    """Curate one scored group (the plain reference; see the module docstring for the rules)."""
    check_finite(group, policy.zero_variance.metric)
    if is_stale(group.policy_version, current_policy_version, policy.max_staleness):
        stale = _stale_decision(group)
        decided = with_segment_advantages(
            stale.trajectories, group.trajectories, policy.segment_advantage, policy.segment_discount
        )
        return GroupDecision(stale.group_id, stale.status, stale.drop_reason, decided, None, ())
    trajs = group.trajectories
    actions = [finish_reason_action(t.finish_reason, policy) for t in trajs]
    used, errors, metric, has_outcome = _baseline(group, actions, policy)
    metric_std, outcome_mean = _stats(group, used, metric, has_outcome, actions)
    members = {i: actions[i] for i in used}
    drop_reason = _group_drop_reason(members, metric_std, outcome_mean, policy)
    if errors and policy.reward_error == "drop_group":
        drop_reason = REASON_REWARD_ERROR
    zero_signal = metric_std is not None and metric_std <= policy.zero_variance.eps
    advantages = dict.fromkeys(used, 0.0)
    if drop_reason is None and not zero_signal:
        order = list(used)
        adv = compute_advantages(
            np.array([used[i] for i in order]),
            policy.advantage,
            np.array([actions[i] == "mask" for i in order]),
        )
        advantages = dict(zip(order, adv.tolist(), strict=True))
    decisions = []
    for i, t in enumerate(trajs):
        action: Action = actions[i]
        reason = REASON_OK if action == "keep" else finish_reason_reason(t.finish_reason)
        if i in errors:
            action, reason = "drop", REASON_REWARD_ERROR
        elif (i in used or action == "mask") and drop_reason is not None:
            action, reason = "drop", drop_reason
        elif i in used and zero_signal and action != "mask":
            reason = REASON_ZERO_VARIANCE
        decisions.append(TrajectoryDecision(t.index, action, reason, advantages.get(i, 0.0), used.get(i)))
    resample = tuple(t.index for t, a in zip(trajs, actions, strict=True) if a == "resample")
    budget = resample_budget(group.max_tokens, policy.resample_budget_multiplier) if resample else None
    status: GroupStatus = "ready" if drop_reason is None else "dropped"
    decided = with_segment_advantages(decisions, trajs, policy.segment_advantage, policy.segment_discount)
    return GroupDecision(group.group_id, status, drop_reason, decided, metric_std, resample, budget, outcome_mean)


def curate_groups(
    groups: Sequence[GroupScore], policy: CurationPolicy, current_policy_version: int | None
) -> list[GroupDecision]:
    """Curate many groups under one policy at once (vectorised with numpy; same results as
    `curate_group` on each). Partition groups by policy before calling."""
    return curate_groups_batched(groups, policy, current_policy_version)
