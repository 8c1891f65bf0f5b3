"""Vectorised curation over many groups: the same rules as `filters.curate.curate_group`, computed on
padded (B, G) numpy arrays (B groups, G the largest group size, `valid` marking real members).

Python touches each trajectory twice (reading its fields, building its decision); everything in
between is numpy. The rules themselves are documented in `filters.curate`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from filters.advantages import batched_advantages
from filters.rules import baseline_actions, check_component_present, overlong_penalties, resample_budget
from filters.segments import with_segment_advantages
from filters.types import (
    ACTIONS,
    BUDGET_REASONS,
    DROP_REASONS,
    FINISH_REASONS,
    REASON_OK,
    REASON_REWARD_ERROR,
    REASON_STALE,
    REASON_ZERO_VARIANCE,
    CurationPolicy,
    GroupDecision,
    GroupScore,
    GroupStatus,
    TrajectoryDecision,
    check_choice,
    finish_reason_reason,
)

KEEP, DROP, MASK, PENALIZE, RESAMPLE = (
    ACTIONS.index(a) for a in ("keep", "drop", "mask", "penalize", "resample")
)
REASONS: tuple[str, ...] = tuple(
    dict.fromkeys(
        [REASON_OK, REASON_ZERO_VARIANCE, *DROP_REASONS, *(finish_reason_reason(f) for f in FINISH_REASONS)]
    )
)
_R = {name: code for code, name in enumerate(REASONS)}
_FR_REASON = np.array([_R[finish_reason_reason(f)] for f in FINISH_REASONS])
_FR_INDEX = {f: i for i, f in enumerate(FINISH_REASONS)}
_BUDGET_CODES = np.array(sorted(_FR_INDEX[f] for f in BUDGET_REASONS))
_ACTION_NAMES = np.array(ACTIONS, dtype=object)
_REASON_NAMES = np.array(REASONS, dtype=object)
_READY = -1


@dataclass(frozen=True)
class _Layout:
    """Where flat trajectory n sits in the padded (B, G) arrays: row[n], col[n]."""

    sizes: np.ndarray  # (B,)
    row: np.ndarray  # (N,)
    col: np.ndarray  # (N,)
    shape: tuple[int, int]

    def pad(self, flat: np.ndarray, fill: float | int | bool) -> np.ndarray:
        """(N,) -> (B, G), padding filled with `fill`."""
        out = np.full(self.shape, fill, dtype=np.asarray(flat).dtype)
        out[self.row, self.col] = flat
        return out

    def flat(self, padded: np.ndarray) -> np.ndarray:
        """(B, G) -> (N,)."""
        return padded[self.row, self.col]


def _layout(groups: Sequence[GroupScore]) -> _Layout:
    """Padded layout of the groups' trajectories."""
    sizes = np.fromiter((len(g.trajectories) for g in groups), dtype=np.int64, count=len(groups))
    starts = np.cumsum(sizes) - sizes
    row = np.repeat(np.arange(len(groups)), sizes)
    col = np.arange(int(sizes.sum())) - np.repeat(starts, sizes)
    return _Layout(sizes, row, col, (len(groups), max(int(sizes.max(initial=0)), 1)))


def _floats(values: list, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(N,) Python floats or None -> (values with NaN for None, missing mask); NaN / inf -> ValueError."""
    arr = np.array(values, dtype=np.float64) if values else np.zeros(0)
    bad = ~np.isfinite(arr)
    for n in np.flatnonzero(bad).tolist():
        if values[n] is not None:
            raise ValueError(f"{what} {values[n]} is not finite; an unscorable reward must be None")
    return arr, bad


@dataclass(frozen=True)
class _Inputs:
    """Padded (B, G) columns of the trajectories plus per-group (B,) columns."""

    valid: np.ndarray
    fr: np.ndarray
    total: np.ndarray
    total_missing: np.ndarray
    outcome: np.ndarray
    outcome_missing: np.ndarray
    component: (
        tuple[np.ndarray, np.ndarray, np.ndarray] | None
    )  # (values, missing, present) of a component metric
    num_tokens: np.ndarray
    num_turns: np.ndarray
    max_tokens: np.ndarray  # (B, G) each member's budget (its own, else its group's), 0 when unknown
    policy_version: np.ndarray  # (B,)


def _fr_codes(flat: list, policy: CurationPolicy) -> np.ndarray:
    """(N,) finish_reason indices into FINISH_REASONS; an unknown reason -> ValueError."""
    try:
        return np.array([_FR_INDEX[t.finish_reason] for t in flat], dtype=np.int64)
    except KeyError as exc:
        check_choice(exc.args[0], FINISH_REASONS, "finish_reason")
        raise


def _component(flat: list, metric: str, lay: _Layout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Padded (values, missing, present) of a component metric."""
    absent = object()
    raw = [t.components.get(metric, absent) for t in flat]
    present = np.array([v is not absent for v in raw], dtype=bool)
    values, missing = _floats([None if v is absent else v for v in raw], f"component {metric!r}")
    return lay.pad(values, np.nan), lay.pad(missing, True), lay.pad(present, False)


def _read(groups: Sequence[GroupScore], policy: CurationPolicy, lay: _Layout) -> _Inputs:
    """Read the fields curation needs out of the groups, once."""
    flat = [t for g in groups for t in g.trajectories]
    total, total_missing = _floats([t.total for t in flat], "total")
    outcome, outcome_missing = _floats([t.outcome for t in flat], "outcome")
    metric = policy.zero_variance.metric
    comp = _component(flat, metric, lay) if metric not in ("outcome", "total") else None
    num_tokens = np.array([t.num_tokens for t in flat], dtype=np.int64)
    return _Inputs(
        valid=lay.pad(np.ones(len(flat), dtype=bool), False),
        fr=lay.pad(_fr_codes(flat, policy), 0),
        total=lay.pad(total, np.nan),
        total_missing=lay.pad(total_missing, True),
        outcome=lay.pad(outcome, np.nan),
        outcome_missing=lay.pad(outcome_missing, True),
        component=comp,
        num_tokens=lay.pad(num_tokens, 0),
        num_turns=lay.pad(np.array([t.num_turns for t in flat], dtype=np.int64), 1),
        max_tokens=lay.pad(
            np.array([t.max_tokens or g.max_tokens or 0 for g in groups for t in g.trajectories], dtype=np.int64), 0
        ),
        policy_version=np.array([g.policy_version for g in groups], dtype=np.int64),
    )


def _stale(x: _Inputs, policy: CurationPolicy, current: int | None) -> np.ndarray:
    """(B,) bool: groups sampled more than max_staleness versions behind."""
    if current is None or policy.max_staleness is None:
        return np.zeros(x.policy_version.shape, dtype=bool)
    return current - x.policy_version > policy.max_staleness


def _penalties(x: _Inputs, act: np.ndarray, base: np.ndarray, policy: CurationPolicy) -> np.ndarray:
    """(B, G) overlong penalty added to the reward of baseline members (0 elsewhere)."""
    out = np.zeros(base.shape)
    rows, cols = np.nonzero(base)
    if rows.size:
        codes = act[rows, cols]
        out[rows, cols] = overlong_penalties(
            x.num_tokens[rows, cols],
            x.max_tokens[rows, cols],
            codes == PENALIZE,
            policy,
            x.num_turns[rows, cols],
            codes == MASK,
            np.isin(x.fr[rows, cols], _BUDGET_CODES),
        )
    return out


@dataclass(frozen=True)
class _Members:
    """Padded (B, G) membership after steps 2-4 of `filters.curate`."""

    act: np.ndarray  # finish-reason action codes
    rerr: np.ndarray  # candidates with a reward error
    base: np.ndarray  # baseline members
    masked: np.ndarray  # mask members outside the baseline (policy.masked_in_baseline off)
    used: np.ndarray  # reward used for advantages (valid where base)
    metric: np.ndarray  # zero-variance metric (valid where base)
    outcome: np.ndarray  # outcome, or total for groups without an outcome (valid where has_out)
    has_out: np.ndarray  # baseline members with a known outcome (all of them without an outcome)


def _check_present(groups: Sequence[GroupScore], cand: np.ndarray, present: np.ndarray, metric: str) -> None:
    """ValueError when a group's candidates all lack the component metric."""
    bad = np.flatnonzero(cand.any(axis=1) & ~(cand & present).any(axis=1))
    if bad.size:
        g = groups[int(bad[0])]
        cols = np.flatnonzero(cand[bad[0], : len(g.trajectories)])
        check_component_present(g, [g.trajectories[int(c)] for c in cols], metric)


def _members(groups: Sequence[GroupScore], x: _Inputs, stale: np.ndarray, policy: CurationPolicy) -> _Members:
    """Steps 3-4: finish-reason actions, reward errors, rewards used, metric values."""
    fr_action = np.array([ACTIONS.index(policy.finish_reason_actions[f]) for f in FINISH_REASONS])
    act = np.where(x.valid, fr_action[x.fr], DROP)
    live = x.valid & ~stale[:, None]
    cand = live & np.isin(act, [ACTIONS.index(a) for a in baseline_actions(policy)])
    has_outcome = (cand & ~x.outcome_missing).any(axis=1)[:, None]
    zv = policy.zero_variance
    needs_outcome = has_outcome & (zv.metric == "outcome" or zv.pass_rate_band is not None)
    missing = x.total_missing | (needs_outcome & x.outcome_missing)
    if x.component is not None:
        _check_present(groups, cand, x.component[2], zv.metric)
        missing = missing | x.component[1]
    rerr = cand & missing
    base = cand & ~rerr
    used = x.total + _penalties(x, act, base, policy)
    shift = np.where(base & (act == PENALIZE), used - x.total, 0.0)  # a penalized member's metric carries it
    if zv.metric == "outcome":
        metric = np.where(has_outcome, x.outcome + shift, used)
    elif zv.metric == "total":
        metric = used
    else:
        assert x.component is not None  # read whenever the metric is a component
        metric = x.component[0] + shift
    outcome = np.where(has_outcome, x.outcome, x.total)
    has_out = base & ~(has_outcome & x.outcome_missing)
    masked = live & (act == MASK) & ~cand
    return _Members(act, rerr, base, masked, used, metric, outcome, has_out)


def _masked_mean_std(values: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row (count, mean, population std) over masked entries: (B, G) -> 3 x (B,); 0 for empty rows."""
    n = mask.sum(axis=1)
    denom = np.maximum(n, 1)
    mean = np.where(mask, values, 0.0).sum(axis=1) / denom
    centred = np.where(mask, values - mean[:, None], 0.0)
    return n, mean, np.sqrt((centred**2).sum(axis=1) / denom)


def _group_reasons(
    m: _Members,
    n: np.ndarray,
    std: np.ndarray,
    outcomes: tuple[np.ndarray, np.ndarray],
    stale: np.ndarray,
    policy: CurationPolicy,
) -> tuple[np.ndarray, np.ndarray]:
    """Step 5: (B,) reason codes (_READY when ready) and (B,) zero-signal flags; later writes win.

    outcomes: (count, mean) (B,) of the known baseline outcomes.
    """
    zv = policy.zero_variance
    reason = np.full(n.shape, _READY)
    if zv.pass_rate_band is not None:
        low, high = zv.pass_rate_band
        n_out, mean = outcomes
        reason[(n_out > 0) & ((mean < low) | (mean > high))] = _R["pass_rate_band"]
    zero_signal = (n > 0) & (std <= zv.eps)
    if zv.action == "drop":
        reason[zero_signal] = _R["zero_variance"]
    reason[(m.base & (m.act != MASK)).sum(axis=1) == 0] = _R["no_trainable_members"]
    reason[n < policy.min_group_size] = _R["below_min_group_size"]
    if policy.reward_error == "drop_group":
        reason[m.rerr.any(axis=1)] = _R["reward_error"]
    reason[stale] = _R["stale"]
    return reason, zero_signal


def _trajectory_codes(
    x: _Inputs, m: _Members, reason: np.ndarray, zero_signal: np.ndarray, stale: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Final (B, G) action and reason codes."""
    dropped = (reason != _READY)[:, None]
    taken_down = (m.base | m.masked) & dropped
    act = np.where(m.rerr | taken_down, DROP, m.act)
    act = np.where(stale[:, None], DROP, act)
    why = np.where(m.act == KEEP, _R[REASON_OK], _FR_REASON[x.fr])
    why = np.where(m.rerr, _R[REASON_REWARD_ERROR], why)
    zero_kept = m.base & ~dropped & zero_signal[:, None] & (m.act != MASK)
    why = np.where(zero_kept, _R[REASON_ZERO_VARIANCE], why)
    why = np.where(taken_down, reason[:, None], why)
    why = np.where(stale[:, None], _R[REASON_STALE], why)
    return act, why


def _optional(values: np.ndarray, present: np.ndarray) -> list[float | None]:
    """(K,) floats -> list with None where not present."""
    out = values.astype(object)
    out[~present] = None
    return out.tolist()


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector, restoring its previous state after.

    Building ~10^5-10^6 decision objects otherwise triggers full collections that rescan every live
    object of the process (the input groups included), about half the run time. The objects built
    here hold no reference cycles, so nothing is left for the collector to find.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def curate_groups_batched(
    groups: Sequence[GroupScore], policy: CurationPolicy, current_policy_version: int | None
) -> list[GroupDecision]:
    """Vectorised `curate_group` over B groups under one policy; same decisions, in input order."""
    if not groups:
        return []
    with _cyclic_gc_paused():
        return _curate(groups, policy, current_policy_version)


def _curate(
    groups: Sequence[GroupScore], policy: CurationPolicy, current_policy_version: int | None
) -> list[GroupDecision]:
    """The body of `curate_groups_batched`, for a non-empty batch."""
    lay = _layout(groups)
    x = _read(groups, policy, lay)
    stale = _stale(x, policy, current_policy_version)
    m = _members(groups, x, stale, policy)
    n, _, std = _masked_mean_std(m.metric, m.base)
    n_out, outcome_mean, _ = _masked_mean_std(m.outcome, m.has_out)
    reason, zero_signal = _group_reasons(m, n, std, (n_out, outcome_mean), stale, policy)
    adv = batched_advantages(np.where(m.base, m.used, 0.0), m.base, policy.advantage, m.act == MASK)
    adv[(reason != _READY) | zero_signal] = 0.0
    act, why = _trajectory_codes(x, m, reason, zero_signal, stale)
    flat_act = lay.flat(act)
    decisions = list(
        map(
            TrajectoryDecision,
            [t.index for g in groups for t in g.trajectories],
            _ACTION_NAMES[flat_act].tolist(),
            _REASON_NAMES[lay.flat(why)].tolist(),
            (lay.flat(adv) + 0.0).tolist(),
            _optional(lay.flat(m.used), lay.flat(m.base)),
        )
    )
    stds, means = _optional(std, n > 0), _optional(outcome_mean, n_out > 0)
    return _assemble(groups, lay, decisions, flat_act, reason, stds, means, policy)


def _assemble(
    groups: Sequence[GroupScore],
    lay: _Layout,
    decisions: list[TrajectoryDecision],
    flat_act: np.ndarray,
    reason: np.ndarray,
    stds: list[float | None],
    means: list[float | None],
    policy: CurationPolicy,
) -> list[GroupDecision]:
    """Per-group decisions from the flat trajectory decisions."""
    resampled = flat_act == RESAMPLE
    resample: dict[int, tuple[int, ...]] = {}
    for pos in np.flatnonzero(resampled).tolist():
        resample.setdefault(int(lay.row[pos]), ())
        resample[int(lay.row[pos])] += (decisions[pos].index,)
    drop = [None if r == _READY else REASONS[r] for r in reason.tolist()]
    ends = np.cumsum(lay.sizes).tolist()
    out = []
    start = 0
    for b, g in enumerate(groups):
        rs = resample.get(b, ())
        budget = resample_budget(g.max_tokens, policy.resample_budget_multiplier) if rs else None
        status: GroupStatus = "ready" if drop[b] is None else "dropped"
        decided = with_segment_advantages(
            decisions[start : ends[b]], g.trajectories, policy.segment_advantage, policy.segment_discount
        )
        out.append(GroupDecision(g.group_id, status, drop[b], decided, stds[b], rs, budget, means[b]))
        start = ends[b]
    return out
