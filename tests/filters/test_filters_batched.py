"""curate_groups (vectorised) must give the same decisions as curate_group (reference) per group."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filters.curate import curate_group, curate_groups
from filters.types import (
    BUDGET_REASONS,
    FINISH_REASONS,
    AdvantageConfig,
    CurationPolicy,
    GroupDecision,
    GroupScore,
    TrajectoryScore,
    ZeroVariance,
)
from filters.types import actions_for as allowed_actions

REWARDS = st.sampled_from([None, 0.0, 0.25, 0.5, 1.0, 1.5, -1.0])
OUTCOMES = st.sampled_from([None, 0.0, 1.0])
FORMAT = st.sampled_from([None, 0.0, 0.1, 0.2])


@st.composite
def trajectories(draw: st.DrawFn, index: int) -> TrajectoryScore:
    components = {} if draw(st.booleans()) else {"format": draw(FORMAT)}
    return TrajectoryScore(
        index=index,
        finish_reason=draw(st.sampled_from(FINISH_REASONS)),
        total=draw(REWARDS),
        components=components,
        outcome=draw(OUTCOMES),
        num_tokens=draw(st.sampled_from([0, 10, 850, 900, 1000, 1200])),
    )


@st.composite
def groups(draw: st.DrawFn, gid: int) -> GroupScore:
    size = draw(st.integers(0, 10))
    return GroupScore(
        group_id=f"g{gid}",
        policy_version=draw(st.integers(0, 10)),
        trajectories=[draw(trajectories(i)) for i in range(size)],
        max_tokens=draw(st.sampled_from([None, 1000])),
    )


def actions_for(reason: str) -> st.SearchStrategy[str]:
    """Every action a policy may give `reason` (the environment's: drop / resample only)."""
    return st.sampled_from(allowed_actions(reason))


def action_maps(complete: bool = False) -> st.SearchStrategy[dict[str, str]]:
    """finish_reason -> action overrides (every reason when `complete`)."""
    each = {f: actions_for(f) for f in FINISH_REASONS}
    return st.fixed_dictionaries(each) if complete else st.fixed_dictionaries({}, optional=each)


@st.composite
def policies(draw: st.DrawFn) -> CurationPolicy:
    band = draw(st.sampled_from([None, (0.2, 0.8), (0.0, 0.5)]))
    return CurationPolicy(
        zero_variance=ZeroVariance(
            metric=draw(st.sampled_from(["outcome", "total", "format"])),
            action=draw(st.sampled_from(["drop", "keep"])),
            pass_rate_band=band,
        ),
        finish_reason_actions=draw(action_maps()),
        max_staleness=draw(st.sampled_from([None, 0, 2, 5])),
        min_group_size=draw(st.integers(1, 4)),
        advantage=draw(
            st.sampled_from(
                [
                    AdvantageConfig(),
                    AdvantageConfig("grpo", "unbiased"),
                    AdvantageConfig("dr_grpo"),
                    AdvantageConfig("rloo"),
                ]
            )
        ),
        overlong_buffer=draw(st.sampled_from([0.0, 0.2, 100.0])),
        reward_error=draw(st.sampled_from(["drop", "drop_group"])),
        soft_overlong=draw(st.booleans()),
        masked_in_baseline=draw(st.booleans()),
    )


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def assert_same(fast: GroupDecision, ref: GroupDecision) -> None:
    """Equal decisions: names exactly, numbers to 1e-9."""
    assert (fast.group_id, fast.status, fast.drop_reason) == (ref.group_id, ref.status, ref.drop_reason)
    assert (fast.resample, fast.resample_max_tokens) == (ref.resample, ref.resample_max_tokens)
    assert _close(fast.metric_std, ref.metric_std) and _close(fast.outcome_mean, ref.outcome_mean)
    assert len(fast.trajectories) == len(ref.trajectories)
    for f, r in zip(fast.trajectories, ref.trajectories, strict=True):
        assert (f.index, f.action, f.reason) == (r.index, r.action, r.reason)
        assert _close(f.advantage, r.advantage) and _close(f.reward_used, r.reward_used)
        assert type(f.advantage) is float
        assert len(f.segment_advantages) == len(r.segment_advantages)
        assert all(_close(a, b) for a, b in zip(f.segment_advantages, r.segment_advantages, strict=True))


def reference(
    batch: list[GroupScore], policy: CurationPolicy, current: int | None
) -> list[GroupDecision] | None:
    """Per-group reference; None when any group is rejected with ValueError."""
    try:
        return [curate_group(g, policy, current) for g in batch]
    except ValueError:
        return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.integers(0, 6).flatmap(lambda n: st.tuples(*[groups(i) for i in range(n)])),
    policy=policies(),
    current=st.sampled_from([None, 5, 10]),
)
def test_vectorised_matches_reference(
    batch: tuple[GroupScore, ...], policy: CurationPolicy, current: int | None
) -> None:
    expected = reference(list(batch), policy, current)
    if expected is None:
        with pytest.raises(ValueError):
            curate_groups(list(batch), policy, current)
        return
    got = curate_groups(list(batch), policy, current)
    assert len(got) == len(expected)
    for fast, ref in zip(got, expected, strict=True):
        assert_same(fast, ref)


@st.composite
def small_budget_groups(draw: st.DrawFn, gid: int) -> GroupScore:
    """Budgets of 1-8 tokens, lengths around them: where rounding the buffer goes wrong."""
    budget = draw(st.integers(1, 8))
    size = draw(st.integers(1, 8))
    trajs = [
        TrajectoryScore(
            index=i,
            finish_reason=draw(st.sampled_from(FINISH_REASONS)),
            total=draw(st.sampled_from([0.0, 1.0])),
            components={},
            outcome=draw(st.sampled_from([0.0, 1.0])),
            num_tokens=draw(st.integers(0, budget + 1)),
        )
        for i in range(size)
    ]
    return GroupScore(f"s{gid}", 0, trajs, max_tokens=budget)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.integers(1, 5).flatmap(lambda n: st.tuples(*[small_budget_groups(i) for i in range(n)])),
    actions=action_maps(complete=True),
    buffer=st.sampled_from([0.0, 0.1, 0.2, 0.5, 0.9, 1.0, 2.0, 3.0, 8.0, 20.0]),
    soft=st.booleans(),
    metric=st.sampled_from(["outcome", "total"]),
    masked_in=st.booleans(),
)
def test_small_budgets_every_action_match_reference(
    batch: tuple[GroupScore, ...],
    actions: dict[str, str],
    buffer: float,
    soft: bool,
    metric: str,
    masked_in: bool,
) -> None:
    policy = CurationPolicy(
        zero_variance=ZeroVariance(metric=metric, action="keep"),
        finish_reason_actions=actions,
        min_group_size=1,
        overlong_buffer=buffer,
        soft_overlong=soft,
        masked_in_baseline=masked_in,
    )
    expected = [curate_group(g, policy, None) for g in batch]
    got = curate_groups(list(batch), policy, None)
    for fast, ref in zip(got, expected, strict=True):
        assert_same(fast, ref)
    for group, dec in zip(batch, got, strict=True):  # and both equal DAPO's formula, written out here
        for t, d in zip(group.trajectories, dec.trajectories, strict=True):
            if d.reward_used is None:
                continue
            penalize = actions[t.finish_reason] == "penalize"
            masked = actions[t.finish_reason] == "mask"  # never shaped: a masked cut is not punished
            # soft_overlong leaves a member longer than the per-turn budget it was not cut by unshaped
            shaped = (soft and t.num_tokens <= group.max_tokens and not masked) or penalize
            unknown = -1.0 if penalize else 0.0  # num_tokens 0: length unknown, the policy's fixed penalty
            # a penalized member cut by a budget reached it, whatever count it was posted with
            length = max(t.num_tokens, group.max_tokens) if penalize and t.finish_reason in BUDGET_REASONS else t.num_tokens
            penalty = _dapo(length, group.max_tokens, buffer) if t.num_tokens else unknown
            want = t.total + (penalty if shaped else 0.0)
            assert d.reward_used == pytest.approx(want, abs=1e-12), (t, group.max_tokens, buffer)


def _dapo(length: int, l_max: int, buffer: float) -> float:
    """DAPO eq. 13 with L_cache = the buffer in tokens (a fraction: floor, at least 1 token; at most
    L_max)."""
    cache = int(buffer) if buffer >= 1 else (max(1, math.floor(buffer * l_max)) if buffer > 0 else 0)
    cache = min(cache, l_max)
    if length >= l_max:  # a sampler capped at L_max returns L_max for a cut response: the ramp's end
        return -1.0
    if length <= l_max - cache:
        return 0.0
    return (l_max - cache - length) / cache


def _group(gid: str, totals: list[float | None], frs: list[str] | None = None, **kw: object) -> GroupScore:
    frs = frs or ["stop"] * len(totals)
    trajs = [TrajectoryScore(i, fr, t, {}, t, 900) for i, (t, fr) in enumerate(zip(totals, frs, strict=True))]
    return GroupScore(gid, kw.pop("policy_version", 3), trajs, **kw)  # type: ignore[arg-type]


def test_mixed_sizes_and_reasons_match_reference() -> None:
    batch = [
        _group("worked", [0.9, 0.6, 0.2, 0.0]),
        _group("solved", [1.0] * 8),
        _group("one", [1.0]),
        _group("empty", []),
        _group("stale", [1.0, 0.0], policy_version=0),
        _group(
            "cut", [1.0, 0.0, 0.0, 0.0, 1.0], ["stop", "length", "tool_failure", "stop", "max_turns"], max_tokens=1000
        ),
        _group("error", [1.0, None, 0.0]),
    ]
    policy = CurationPolicy(max_staleness=2, finish_reason_actions={"max_turns": "penalize"})
    got = curate_groups(batch, policy, 4)
    for fast, g in zip(got, batch, strict=True):
        assert_same(fast, curate_group(g, policy, 4))
    assert [d.drop_reason for d in got] == [
        None,
        "zero_variance",
        "below_min_group_size",
        "below_min_group_size",
        "stale",
        None,
        None,
    ]
    cut = got[5].trajectories
    assert [t.action for t in cut] == ["keep", "mask", "drop", "keep", "penalize"]
    # the penalized max_turns cut reached its budget: 1 + (-1); the masked cut is outside the baseline
    assert [t.reward_used for t in cut] == [1.0, None, None, 0.0, 0.0]
    assert [t.reason for t in got[6].trajectories] == ["ok", "reward_error", "ok"]


def test_empty_batch() -> None:
    assert curate_groups([], CurationPolicy(), None) == []


def test_errors_match_reference() -> None:
    bad = _group("nan", [1.0, float("nan")])
    with pytest.raises(ValueError, match="not finite"):
        curate_groups([_group("ok", [1.0, 0.0]), bad], CurationPolicy(), None)
    unknown = _group("x", [1.0, 0.0], ["stop", "oom"])
    with pytest.raises(ValueError, match="finish_reason"):
        curate_groups([unknown], CurationPolicy(), None)
    missing = _group("m", [1.0, 0.0])
    with pytest.raises(ValueError, match="not a component"):
        curate_groups([missing], CurationPolicy(zero_variance=ZeroVariance(metric="format")), None)
