"""curate_group (the per-group reference): zero variance, finish_reason actions, reward errors,
min group size, staleness, overlong penalty, resample, pass-rate band."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from filters.advantages import grpo_advantages
from filters.curate import curate_group, curate_groups
from filters.types import (
    ACTIONS,
    BUDGET_REASONS,
    ENVIRONMENT_ACTIONS,
    ENVIRONMENT_REASONS,
    FINISH_REASONS,
    AdvantageConfig,
    CurationPolicy,
    GroupDecision,
    GroupScore,
    TrajectoryScore,
    ZeroVariance,
    actions_for,
)


def make_group(
    totals: Sequence[float | None],
    finish_reasons: Sequence[str] | None = None,
    outcomes: Sequence[float | None] | None = None,
    components: Sequence[Mapping[str, float | None]] | None = None,
    num_tokens: Sequence[int] | None = None,
    **overrides: object,
) -> GroupScore:
    """A group of len(totals) trajectories; everything not given is "stop", no outcome, no tokens."""
    n = len(totals)
    trajectories = [
        TrajectoryScore(
            index=i,
            finish_reason=(finish_reasons or ["stop"] * n)[i],
            total=totals[i],
            components=(components or [{}] * n)[i],
            outcome=(outcomes or [None] * n)[i],
            num_tokens=(num_tokens or [0] * n)[i],
        )
        for i in range(n)
    ]
    fields: dict = {"group_id": "g1", "policy_version": 5, "trajectories": trajectories, "max_tokens": None}
    fields.update(overrides)
    return GroupScore(**fields)


def advantages(d: GroupDecision) -> list[float]:
    return [t.advantage for t in d.trajectories]


def actions(d: GroupDecision) -> list[str]:
    return [t.action for t in d.trajectories]


class TestWorkedCheck:
    @pytest.mark.parametrize(
        ("cfg", "expected", "digits"),
        [
            (AdvantageConfig("grpo"), [1.36, 0.50, -0.64, -1.22], 2),
            (AdvantageConfig("grpo", "unbiased"), [1.18, 0.43, -0.56, -1.05], 2),
            (AdvantageConfig("rloo"), [0.633, 0.233, -0.300, -0.567], 3),
        ],
    )
    def test_worked_check(self, cfg: AdvantageConfig, expected: list[float], digits: int) -> None:
        policy = CurationPolicy(advantage=cfg, zero_variance=ZeroVariance(metric="total"))
        d = curate_group(make_group([0.9, 0.6, 0.2, 0.0]), policy, None)
        assert d.status == "ready" and d.drop_reason is None
        assert np.round(advantages(d), digits).tolist() == expected
        assert d.metric_std == pytest.approx(0.349, abs=5e-4)
        assert [t.reward_used for t in d.trajectories] == [0.9, 0.6, 0.2, 0.0]


class TestZeroVariance:
    @pytest.mark.parametrize("outcome", [0.0, 1.0])
    def test_binary_all_same_is_dropped(self, outcome: float) -> None:
        d = curate_group(make_group([outcome] * 4, outcomes=[outcome] * 4), CurationPolicy(), None)
        assert (d.status, d.drop_reason) == ("dropped", "zero_variance")
        assert actions(d) == ["drop"] * 4
        assert {t.reason for t in d.trajectories} == {"zero_variance"}
        assert advantages(d) == [0.0] * 4
        assert d.metric_std == 0.0 and d.outcome_mean == outcome

    def test_binary_mixed_is_ready(self) -> None:
        d = curate_group(
            make_group([1.0, 0.0, 0.0, 1.0], outcomes=[1.0, 0.0, 0.0, 1.0]), CurationPolicy(), None
        )
        assert d.status == "ready"
        np.testing.assert_allclose(advantages(d), [1, -1, -1, 1], atol=1e-5)
        assert d.outcome_mean == 0.5

    def test_keep_action_keeps_group_with_zero_advantages(self) -> None:
        policy = CurationPolicy(zero_variance=ZeroVariance(action="keep"))
        d = curate_group(make_group([1.0, 1.1, 1.2], outcomes=[1.0] * 3), policy, None)
        assert d.status == "ready"
        assert actions(d) == ["keep"] * 3
        assert [t.reason for t in d.trajectories] == ["zero_variance"] * 3
        assert advantages(d) == [0.0] * 3

    def test_all_correct_with_different_format_is_zero_variance_on_outcome_not_total(self) -> None:
        formats = [{"format": 0.1, "math": 1.0}, {"format": 0.0, "math": 1.0}, {"format": 0.2, "math": 1.0}]
        group = make_group([1.1, 1.0, 1.2], outcomes=[1.0] * 3, components=formats)
        on_outcome = curate_group(group, CurationPolicy(), None)
        assert on_outcome.drop_reason == "zero_variance"
        on_total = curate_group(group, CurationPolicy(zero_variance=ZeroVariance(metric="total")), None)
        assert on_total.status == "ready"
        assert on_total.metric_std == pytest.approx(np.std([1.1, 1.0, 1.2]))
        np.testing.assert_allclose(advantages(on_total), grpo_advantages(np.array([1.1, 1.0, 1.2])))
        on_format = curate_group(group, CurationPolicy(zero_variance=ZeroVariance(metric="format")), None)
        assert on_format.status == "ready"
        on_math = curate_group(group, CurationPolicy(zero_variance=ZeroVariance(metric="math")), None)
        assert on_math.drop_reason == "zero_variance"

    def test_outcome_falls_back_to_total_without_outcome(self) -> None:
        d = curate_group(make_group([0.5, 0.5, 0.5]), CurationPolicy(), None)
        assert d.drop_reason == "zero_variance"
        d = curate_group(make_group([0.5, 0.0, 0.5]), CurationPolicy(), None)
        assert d.status == "ready" and d.outcome_mean == pytest.approx(1 / 3)

    def test_eps_is_the_threshold(self) -> None:
        group = make_group([1.0, 0.9], outcomes=None)
        assert (
            curate_group(group, CurationPolicy(zero_variance=ZeroVariance(eps=0.06)), None).status
            == "dropped"
        )
        assert (
            curate_group(group, CurationPolicy(zero_variance=ZeroVariance(eps=0.04)), None).status == "ready"
        )

    def test_unknown_component_metric_raises_listing_valid(self) -> None:
        group = make_group([1.0, 0.0], components=[{"format": 1.0}, {"format": 0.0}])
        with pytest.raises(ValueError, match="format"):
            curate_group(group, CurationPolicy(zero_variance=ZeroVariance(metric="fromat")), None)

    def test_pass_rate_band(self) -> None:
        group = make_group([1.0, 1.0, 1.0, 0.0], outcomes=[1.0, 1.0, 1.0, 0.0])
        narrow = CurationPolicy(zero_variance=ZeroVariance(pass_rate_band=(0.1, 0.7)))
        d = curate_group(group, narrow, None)
        assert (d.status, d.drop_reason, d.outcome_mean) == ("dropped", "pass_rate_band", 0.75)
        wide = CurationPolicy(zero_variance=ZeroVariance(pass_rate_band=(0.0, 0.8)))
        assert curate_group(group, wide, None).status == "ready"


def _finish_reason_case(
    finish_reason: str, action: str, masked_in_baseline: bool = False
) -> tuple[GroupScore, CurationPolicy]:
    """Three normal members [1, 0, 1] and member 3 ending with `finish_reason`, handled by `action`."""
    others = "stop" if finish_reason != "stop" else "length"
    group = make_group(
        [1.0, 0.0, 1.0, 0.5],
        finish_reasons=[others] * 3 + [finish_reason],
        num_tokens=[100, 100, 100, 900],
        max_tokens=1000,
    )
    overrides = {finish_reason: action} | ({} if others == "stop" else {"length": "keep"})
    policy = CurationPolicy(
        finish_reason_actions=overrides,
        zero_variance=ZeroVariance(metric="total"),
        masked_in_baseline=masked_in_baseline,
    )
    return group, policy


ALLOWED = [
    (f, a) for f in FINISH_REASONS for a in actions_for(f)
]


@pytest.mark.parametrize("masked_in_baseline", [False, True])
@pytest.mark.parametrize(("finish_reason", "action"), ALLOWED)
def test_every_finish_reason_and_action(finish_reason: str, action: str, masked_in_baseline: bool) -> None:
    group, policy = _finish_reason_case(finish_reason, action, masked_in_baseline)
    d = curate_group(group, policy, None)
    member = d.trajectories[3]
    assert d.status == "ready"
    assert member.action == action
    assert member.reason == ("ok" if action == "keep" else f"finish_reason:{finish_reason}")
    # buffer 0.2 * 1000 = 200 tokens: 900 tokens is 100 into the buffer -> penalty -0.5
    baseline = {
        "keep": [1.0, 0.0, 1.0, 0.5],
        "mask": [1.0, 0.0, 1.0, 0.5] if masked_in_baseline else [1.0, 0.0, 1.0],
        # a stop member in the buffer gets the ramp (-0.5); one cut by a budget reached it, whatever its
        # posted count: the full -1
        "penalize": [1.0, 0.0, 1.0, -0.5 if finish_reason in BUDGET_REASONS else 0.0],
        "drop": [1.0, 0.0, 1.0],
        "resample": [1.0, 0.0, 1.0],
        "resume": [1.0, 0.0, 1.0],  # out of the baseline like resample until its continuation fills the slot
    }[action]
    expected = grpo_advantages(np.array(baseline)).tolist() + [0.0] * (4 - len(baseline))
    if action == "mask":
        expected[3] = 0.0  # in or out of the baseline, never trained on
    np.testing.assert_allclose(advantages(d), expected)
    assert member.reward_used == (baseline[3] if len(baseline) == 4 else None)
    assert d.resample == ((3,) if action == "resample" else ())
    assert d.resample_max_tokens == (2000 if action == "resample" else None)


@pytest.mark.parametrize("reason", sorted(ENVIRONMENT_REASONS))
@pytest.mark.parametrize("action", sorted(set(ACTIONS) - set(ENVIRONMENT_ACTIONS)))
def test_an_environment_failure_takes_only_drop_or_resample(reason: str, action: str) -> None:
    # mask would put the failure's 0 in the baseline, keep / penalize would train it as a negative
    with pytest.raises(ValueError, match=f"{reason}.*valid: drop, resample"):
        CurationPolicy(finish_reason_actions={reason: action})


def test_default_finish_reason_actions() -> None:
    group = make_group([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], finish_reasons=list(FINISH_REASONS))
    d = curate_group(group, CurationPolicy(), None)
    # stop, length, max_turns, tool_misuse (the model's: a negative), then the environment's four
    assert actions(d) == ["keep", "mask", "mask", "keep", "drop", "drop", "drop", "drop"]
    # the cut members are outside the baseline by default: only the model's own endings count
    assert [t.reward_used for t in d.trajectories] == [1.0, None, None, 0.0, None, None, None, None]


def test_infrastructure_failures_are_never_negatives() -> None:
    group = make_group(
        [1.0, 1.0, 0.0], finish_reasons=["stop", "stop", "tool_failure"], outcomes=[1.0, 1.0, 0.0]
    )
    d = curate_group(group, CurationPolicy(), None)
    assert d.drop_reason == "zero_variance"  # the failed call does not make a [1, 1, 0] group


def test_unknown_finish_reason_raises_listing_valid() -> None:
    with pytest.raises(ValueError, match="stop, length"):
        curate_group(make_group([1.0, 0.0], finish_reasons=["stop", "oom"]), CurationPolicy(), None)


class TestRewardErrors:
    def test_missing_total_is_dropped_not_a_negative(self) -> None:
        d = curate_group(make_group([1.0, None, 0.0, 1.0]), CurationPolicy(), None)
        assert d.status == "ready"
        assert (d.trajectories[1].action, d.trajectories[1].reason) == ("drop", "reward_error")
        kept = grpo_advantages(np.array([1.0, 0.0, 1.0])).tolist()  # the None is not a 0
        np.testing.assert_allclose(advantages(d), [kept[0], 0.0, kept[1], kept[2]])

    def test_drop_group_policy(self) -> None:
        d = curate_group(make_group([1.0, None, 0.0]), CurationPolicy(reward_error="drop_group"), None)
        assert (d.status, d.drop_reason) == ("dropped", "reward_error")
        assert [t.reason for t in d.trajectories] == ["reward_error"] * 3

    def test_missing_outcome_when_others_have_one(self) -> None:
        d = curate_group(make_group([1.0, 0.0, 0.0], outcomes=[1.0, None, 0.0]), CurationPolicy(), None)
        assert d.trajectories[1].reason == "reward_error"
        assert d.status == "ready"

    def test_missing_component_metric(self) -> None:
        comps = [{"f": 1.0}, {"f": None}, {}, {"f": 0.0}]
        policy = CurationPolicy(zero_variance=ZeroVariance(metric="f"))
        d = curate_group(make_group([1.0, 0.0, 0.0, 0.0], components=comps), policy, None)
        assert [t.reason for t in d.trajectories] == ["ok", "reward_error", "reward_error", "ok"]

    @pytest.mark.parametrize("bad", [float("nan"), float("inf")])
    def test_nan_or_inf_raises(self, bad: float) -> None:
        with pytest.raises(ValueError, match="not finite"):
            curate_group(make_group([1.0, bad]), CurationPolicy(), None)
        with pytest.raises(ValueError, match="not finite"):
            curate_group(make_group([1.0, 0.0], outcomes=[1.0, bad]), CurationPolicy(), None)


class TestGroupSize:
    def test_below_min_after_drops(self) -> None:
        group = make_group([1.0, 0.0, 0.0, 0.0], finish_reasons=["stop", "env_error", "env_error", "timeout"])
        d = curate_group(group, CurationPolicy(min_group_size=2), None)
        assert (d.status, d.drop_reason) == ("dropped", "below_min_group_size")
        assert [t.reason for t in d.trajectories] == [
            "below_min_group_size",
            "finish_reason:env_error",
            "finish_reason:env_error",
            "finish_reason:timeout",
        ]
        assert actions(d) == ["drop"] * 4

    def test_masked_members_do_not_count_by_default(self) -> None:
        group = make_group([1.0, 0.0, 0.0, 0.0], finish_reasons=["stop", "stop", "length", "max_turns"])
        d = curate_group(group, CurationPolicy(min_group_size=4), None)
        assert (d.status, d.drop_reason) == ("dropped", "below_min_group_size")  # 2 completers < 4
        assert [t.reason for t in d.trajectories] == ["below_min_group_size"] * 4
        ready = curate_group(group, CurationPolicy(min_group_size=2), None)
        assert actions(ready) == ["keep", "keep", "mask", "mask"]
        np.testing.assert_allclose(advantages(ready), [1.0, -1.0, 0, 0], rtol=1e-5)  # [1, 0] alone

    def test_masked_members_count_with_masked_in_baseline(self) -> None:
        group = make_group([1.0, 0.0, 0.0, 0.0], finish_reasons=["stop", "stop", "length", "max_turns"])
        d = curate_group(group, CurationPolicy(min_group_size=4, masked_in_baseline=True), None)
        assert d.status == "ready"
        assert actions(d) == ["keep", "keep", "mask", "mask"]
        # the masked zeros stay in the baseline: mean 0.25, population std sqrt(3)/4
        np.testing.assert_allclose(
            advantages(d), [0.75 / (3**0.5 / 4), -0.25 / (3**0.5 / 4), 0, 0], rtol=1e-5
        )

    def test_all_masked_has_no_trainable_members(self) -> None:
        group = make_group([1.0, 0.0], finish_reasons=["length", "length"])
        d = curate_group(group, CurationPolicy(masked_in_baseline=True), None)
        assert (d.status, d.drop_reason) == ("dropped", "no_trainable_members")
        # out of the baseline, nothing is left to compare: too small
        d = curate_group(group, CurationPolicy(), None)
        assert (d.status, d.drop_reason) == ("dropped", "below_min_group_size")
        assert actions(d) == ["drop", "drop"]

    def test_empty_group(self) -> None:
        d = curate_group(make_group([]), CurationPolicy(min_group_size=1), None)
        assert (d.status, d.drop_reason, d.metric_std, d.outcome_mean) == (
            "dropped",
            "below_min_group_size",
            None,
            None,
        )

    def test_group_of_one(self) -> None:
        d = curate_group(make_group([1.0]), CurationPolicy(min_group_size=1), None)
        assert d.drop_reason == "zero_variance"
        keep = CurationPolicy(min_group_size=1, zero_variance=ZeroVariance(action="keep"))
        assert advantages(curate_group(make_group([1.0]), keep, None)) == [0.0]


class TestStaleness:
    @pytest.mark.parametrize(
        ("current", "max_staleness", "stale"),
        [(8, 2, True), (7, 2, False), (5, 0, False), (6, 0, True), (100, None, False), (None, 0, False)],
    )
    def test_staleness(self, current: int | None, max_staleness: int | None, stale: bool) -> None:
        group = make_group([1.0, 0.0, 1.0], finish_reasons=["stop", "stop", "length"], policy_version=5)
        policy = CurationPolicy(max_staleness=max_staleness, finish_reason_actions={"length": "resample"})
        d = curate_group(group, policy, current)
        if stale:
            assert (d.status, d.drop_reason, d.metric_std, d.resample) == ("dropped", "stale", None, ())
            assert [(t.action, t.reason, t.reward_used) for t in d.trajectories] == [
                ("drop", "stale", None)
            ] * 3
        else:
            assert d.status == "ready" and d.resample == (2,)


class TestPenalizeAndResample:
    def test_soft_penalty_and_fixed_penalty(self) -> None:
        policy = CurationPolicy(
            finish_reason_actions={"length": "penalize"}, overlong_buffer=100, penalty=-2.0
        )
        group = make_group(
            [1.0, 1.0, 1.0], finish_reasons=["stop", "length", "length"], num_tokens=[10, 950, 0]
        )
        soft = curate_group(dataclasses.replace(group, max_tokens=1000), policy, None)
        # a penalized `length` member reached its budget whatever count it was posted with: -1, not the ramp's
        # -0.5 at 950 of 1000 (the ramp shapes members that stopped by themselves: soft_overlong)
        assert [t.reward_used for t in soft.trajectories] == [1.0, 0.0, -1.0]
        fixed = curate_group(group, policy, None)  # max_tokens unknown
        assert [t.reward_used for t in fixed.trajectories] == [1.0, -1.0, -1.0]
        assert fixed.status == "ready" and actions(fixed) == ["keep", "penalize", "penalize"]

    def test_penalize_on_length_is_exactly_minus_one(self) -> None:
        # a `length` member stopped at the budget: the ramp's end, -1, whatever the buffer
        for buffer in (0.2, 0.5, 1.0, 3.0, 100.0):
            policy = CurationPolicy(finish_reason_actions={"length": "penalize"}, overlong_buffer=buffer)
            for budget in (1, 2, 3, 8, 1000):
                group = make_group([1.0, 1.0], ["stop", "length"], num_tokens=[1, budget], max_tokens=budget)
                d = curate_group(group, policy, None)
                assert d.trajectories[1].reward_used == 0.0, (buffer, budget)  # total 1 + (-1)

    @pytest.mark.parametrize("reason", sorted(BUDGET_REASONS))
    @pytest.mark.parametrize("buffer", [0.0, 0.2, 1.0, 100.0])
    def test_penalize_on_a_cut_below_the_budget_is_minus_one(self, reason: str, buffer: float) -> None:
        # posted with fewer tokens than the budget (a context window, a turn limit, a count without the
        # last turn): still cut, so the full -1 -- with buffer 0 the ramp alone gave 0 below the budget
        policy = CurationPolicy(finish_reason_actions={reason: "penalize"}, overlong_buffer=buffer)
        for budget in (1, 2, 8, 1000):
            for posted in sorted({1, max(1, budget // 2), budget}):
                group = make_group([1.0, 1.0], ["stop", reason], num_tokens=[1, posted], max_tokens=budget)
                d = curate_group(group, policy, None)
                assert d.trajectories[1].reward_used == 0.0, (buffer, budget, posted)  # total 1 + (-1)
                assert curate_groups([group], policy, None)[0].trajectories[1].reward_used == 0.0

    def test_a_replacement_is_shaped_against_its_own_larger_budget(self) -> None:
        # soft_overlong, group budget 100, a resampled member sampled at 200: 190 tokens are 10 into its own
        # 20-token buffer (-0.5); against the group's 100 it was "longer than the budget" and left unshaped
        policy = CurationPolicy(soft_overlong=True, overlong_buffer=0.1)
        members = [
            TrajectoryScore(0, "stop", 1.0, {}, 1.0, num_tokens=95),  # 5 into the group's 10-token buffer
            TrajectoryScore(1, "stop", 1.0, {}, 1.0, num_tokens=190, max_tokens=200),
            TrajectoryScore(2, "stop", 0.0, {}, 0.0, num_tokens=50),
        ]
        group = GroupScore("g", 0, members, max_tokens=100)
        for d in (curate_group(group, policy, None), curate_groups([group], policy, None)[0]):
            assert [t.reward_used for t in d.trajectories] == pytest.approx([0.5, 0.5, 0.0])

    def test_soft_overlong_shapes_stop_members_inside_the_buffer(self) -> None:
        # L_max 10, L_cache 4 (0.4 x 10): lengths 6 -> 0, 7 -> -0.25, 9 -> -0.75, 10 (cut) -> -1
        group = make_group(
            [1.0, 1.0, 1.0, 0.0], ["stop", "stop", "stop", "length"], num_tokens=[6, 7, 9, 10], max_tokens=10
        )
        off = curate_group(group, CurationPolicy(overlong_buffer=0.4), None)
        assert [t.reward_used for t in off.trajectories] == [1.0, 1.0, 1.0, None]  # stop members untouched
        on = curate_group(group, CurationPolicy(overlong_buffer=0.4, soft_overlong=True), None)
        assert [t.reward_used for t in on.trajectories][:3] == pytest.approx([1.0, 0.75, 0.25])
        assert on.trajectories[3].reward_used is None  # the cut member is masked, outside the baseline
        assert actions(on) == ["keep", "keep", "keep", "mask"]
        # shaping alone gives signal to an all-correct group only when the metric is the shaped total
        solved = make_group([1.0] * 3, outcomes=[1.0] * 3, num_tokens=[2, 9, 9], max_tokens=10)
        policy = CurationPolicy(overlong_buffer=0.4, soft_overlong=True)
        assert curate_group(solved, policy, None).drop_reason == "zero_variance"

    def test_soft_overlong_and_penalize_do_not_add_twice(self) -> None:
        policy = CurationPolicy(
            finish_reason_actions={"length": "penalize"}, overlong_buffer=2, soft_overlong=True
        )
        group = make_group([1.0, 1.0, 1.0], ["stop", "length", "length"], num_tokens=[3, 4, 0], max_tokens=4)
        d = curate_group(group, policy, None)
        assert [t.reward_used for t in d.trajectories] == [0.5, 0.0, 0.0]  # 0 tokens: unknown, fixed -1

    def test_resample_listed_even_when_group_dropped(self) -> None:
        policy = CurationPolicy(finish_reason_actions={"length": "resample"}, resample_budget_multiplier=1.5)
        group = make_group([1.0, 0.0, 0.0], finish_reasons=["stop", "length", "length"], max_tokens=1001)
        d = curate_group(group, policy, None)
        assert (d.drop_reason, d.resample, d.resample_max_tokens) == ("below_min_group_size", (1, 2), 1502)
        assert actions(d) == ["drop", "resample", "resample"]


@pytest.mark.parametrize("metric", ["outcome", "correct"])
@pytest.mark.parametrize(("outcomes", "used"), [
    ([1.0, 1.0, 1.0], [1.0, 1.0, 0.0]),  # the cut one reached the right outcome before its budget
    ([0.0, 0.0, 0.0], [0.0, 0.0, -1.0]),  # all wrong: the cut one is the worst
])
def test_a_penalized_cut_is_a_failure_in_the_zero_variance_check_too(metric, outcomes, used) -> None:
    """Attack: with the default zero-variance metric (outcome) the penalty never reached training --
    [correct, correct, cut] has rewards used [1, 1, 0] but outcomes [1, 1, 1], so the group was dropped as
    zero variance. A penalized member's metric carries its penalty, per-group and vectorised alike; a
    group without a penalized member is judged as before."""
    policy = CurationPolicy(finish_reason_actions={"length": "penalize"},
                            zero_variance=ZeroVariance(metric=metric, eps=1e-6, action="drop"))
    comps = [{"correct": o} for o in outcomes]
    group = make_group(outcomes, ["stop", "stop", "length"], outcomes=outcomes, components=comps,
                       num_tokens=[3, 4, 8], max_tokens=8)
    for d in (curate_group(group, policy, None), curate_groups([group], policy, None)[0]):
        assert d.status == "ready", d
        assert [t.reward_used for t in d.trajectories] == used
        adv = advantages(d)
        assert adv[2] < 0 and adv[2] == min(adv)
    plain = make_group(outcomes, outcomes=outcomes, components=comps, num_tokens=[3, 4, 8], max_tokens=8)
    for d in (curate_group(plain, policy, None), curate_groups([plain], policy, None)[0]):
        assert (d.status, d.drop_reason) == ("dropped", "zero_variance")
