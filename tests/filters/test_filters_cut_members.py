"""A member cut by a budget is not a wrong answer: by default it leaves the group baseline (mean, std,
zero variance, pass rate), so adding one never changes what the completers are taught. With
`masked_in_baseline` the DAPO behaviour (masked loss, member kept in the group) comes back."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filters.curate import curate_group, curate_groups
from filters.policy import CurationPolicySpec
from filters.types import (
    AdvantageConfig,
    CurationPolicy,
    GroupDecision,
    GroupScore,
    TrajectoryScore,
    ZeroVariance,
)

BUDGET = 100


def _member(index: int, finish_reason: str, reward: float | None, tokens: int) -> TrajectoryScore:
    return TrajectoryScore(index, finish_reason, reward, {"format": reward}, reward, tokens)


def _group(members: list[TrajectoryScore]) -> GroupScore:
    return GroupScore("g", 3, members, max_tokens=BUDGET)


def _both(group: GroupScore, policy: CurationPolicy) -> list[GroupDecision]:
    """The per-group reference and the vectorised path on the same group."""
    return [curate_group(group, policy, None), curate_groups([group], policy, None)[0]]


def _completers(d: GroupDecision, cut_index: int) -> list[tuple]:
    """Each completer's decision; its advantage compared apart (``_same_advantages``): a sum taken over one
    member more may differ in the last bits, and rounding both to a fixed number of digits can still land
    either side of a boundary (it did: 1.434228007866 against ...867)."""
    return [(t.index, t.action, t.reason, t.reward_used) for t in d.trajectories if t.index != cut_index]


def _same_advantages(a: GroupDecision, b: GroupDecision, cut_index: int) -> bool:
    def advantages(d: GroupDecision) -> list[float | None]:
        return [t.advantage for t in d.trajectories if t.index != cut_index]

    x, y = advantages(a), advantages(b)
    return len(x) == len(y) and all(_close(u, v) for u, v in zip(x, y, strict=True))


def _close(a: float | None, b: float | None) -> bool:
    return a is b if a is None or b is None else math.isclose(a, b, abs_tol=1e-12)


completers = st.lists(
    st.tuples(
        st.sampled_from(["stop", "tool_misuse"]),
        st.sampled_from([0.0, 0.25, 0.5, 1.0]),
        st.integers(1, BUDGET),
    ),
    min_size=0,
    max_size=8,
)


@st.composite
def cut_policies(draw: st.DrawFn, cut_action: str, reason: str = "length") -> CurationPolicy:
    """Random policies (masked_in_baseline left at its default) with `reason` -> cut_action; the remedies'
    wait (0: trained at once) and resume bound vary too (an exhausted resume stays out of the baseline)."""
    return CurationPolicy(
        zero_variance=ZeroVariance(
            metric=draw(st.sampled_from(["outcome", "total", "format"])),
            action=draw(st.sampled_from(["drop", "keep"])),
            pass_rate_band=draw(st.sampled_from([None, (0.2, 0.8)])),
        ),
        finish_reason_actions={reason: cut_action},
        min_group_size=draw(st.integers(1, 4)),
        advantage=draw(
            st.sampled_from(
                [AdvantageConfig(), AdvantageConfig("grpo", "unbiased"), AdvantageConfig("dr_grpo"),
                 AdvantageConfig("rloo")]
            )
        ),
        overlong_buffer=draw(st.sampled_from([0.0, 0.2, 10.0])),
        reward_error=draw(st.sampled_from(["drop", "drop_group"])),
        soft_overlong=draw(st.booleans()),
        segment_advantage=draw(st.sampled_from(["broadcast", "divide", "discount"])),
        max_resumes=draw(st.integers(0, 3)),
        resample_wait_seconds=draw(st.sampled_from([0, 300])),
    )


@pytest.mark.parametrize("reason", ["length", "max_turns"])
@pytest.mark.parametrize("cut_action", ["mask", "drop", "resample", "resume"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), members=completers, cut_reward=st.sampled_from([None, 0.0, 1.0]))
def test_adding_a_cut_member_never_changes_the_completers(
    reason: str, cut_action: str, data: st.DataObject, members: list, cut_reward: float | None
) -> None:
    policy = data.draw(cut_policies(cut_action, reason))
    before = [_member(i, fr, r, n) for i, (fr, r, n) in enumerate(members)]
    at = data.draw(st.integers(0, len(before)))
    cut = _member(99, reason, cut_reward, data.draw(st.sampled_from([BUDGET, 3 * BUDGET])))
    with_cut = _group(before[:at] + [cut] + before[at:])
    try:
        expected = curate_group(_group(before), policy, None)
    except ValueError:  # a component metric none of the completers has: the cut member cannot fix that
        with pytest.raises(ValueError):
            curate_group(with_cut, policy, None)
        return
    for got in _both(with_cut, policy):
        assert (got.status, got.drop_reason) == (expected.status, expected.drop_reason)
        assert _close(got.metric_std, expected.metric_std)
        assert _close(got.outcome_mean, expected.outcome_mean)
        assert _completers(got, 99) == _completers(expected, 99)
        assert _same_advantages(got, expected, 99)
        cut_decision = next(t for t in got.trajectories if t.index == 99)
        assert (cut_decision.advantage, cut_decision.reward_used) == (0.0, None)


@pytest.mark.parametrize("cut_action", ["keep", "penalize"])
def test_keep_and_penalize_put_the_cut_member_in_the_baseline(cut_action: str) -> None:
    # these two train on the cut member by choice: it is a member like any other
    group = _group([_member(0, "stop", 1.0, 10), _member(1, "stop", 0.0, 10), _member(2, "length", 0.0, BUDGET)])
    for d in _both(group, CurationPolicy(finish_reason_actions={"length": cut_action})):
        assert d.trajectories[2].reward_used == (0.0 if cut_action == "keep" else -1.0)


def test_masked_in_baseline_puts_the_cut_member_back() -> None:
    group = _group([_member(0, "stop", 1.0, 10), _member(1, "stop", 0.0, 10), _member(2, "length", 0.0, BUDGET)])
    for d in _both(group, CurationPolicy(masked_in_baseline=True)):
        assert [t.reward_used for t in d.trajectories] == [1.0, 0.0, 0.0]


# -- the numbers, by hand ------------------------------------------------------------------------


def _three_correct_one_cut() -> GroupScore:
    return _group([_member(i, "stop", 1.0, 10) for i in range(3)] + [_member(3, "length", 0.0, BUDGET)])


def test_three_correct_and_one_cut_is_zero_variance() -> None:
    # without the cut member the group is [1, 1, 1]: no signal, nothing to train
    for d in _both(_three_correct_one_cut(), CurationPolicy()):
        assert (d.status, d.drop_reason, d.metric_std, d.outcome_mean) == ("dropped", "zero_variance", 0.0, 1.0)
        assert [t.action for t in d.trajectories] == ["drop"] * 4


def test_three_correct_and_one_cut_with_masked_in_baseline_is_dapo() -> None:
    # DAPO's overlong filtering: [1, 1, 1, 0], mean 0.75, population std sqrt(3)/4 = 0.433
    # -> each completer +0.25 / 0.433 = +0.577, all of it from the truncation
    for d in _both(_three_correct_one_cut(), CurationPolicy(masked_in_baseline=True)):
        assert d.status == "ready"
        np.testing.assert_allclose([t.advantage for t in d.trajectories], [1 / 3**0.5] * 3 + [0.0], rtol=1e-5)


def _soft_case() -> GroupScore:
    """[stop 1, stop 0, cut]: the cut member hit the budget (the ramp would give it -1)."""
    return _group([_member(0, "stop", 1.0, 10), _member(1, "stop", 0.0, 10), _member(2, "length", 0.0, BUDGET)])


@pytest.mark.parametrize(
    ("policy", "wrong_answer"),
    [
        # out of the baseline: [1, 0], std 0.5 -> -1.0; with the unbiased std (0.707) -> -0.707
        (CurationPolicy(soft_overlong=True), -1.0),
        (CurationPolicy(soft_overlong=True, advantage=AdvantageConfig("grpo", "unbiased")), -1 / 2**0.5),
        # in the baseline (DAPO) at its raw 0, never shaped: [1, 0, 0], mean 1/3, std 0.471 -> -0.707
        (CurationPolicy(soft_overlong=True, masked_in_baseline=True), -1 / 2**0.5),
    ],
)
def test_soft_overlong_never_puts_a_masked_member_in_at_minus_one(policy: CurationPolicy, wrong_answer: float) -> None:
    # before: the masked member entered at -1 -> [1, 0, -1], mean 0: the wrong answer got 0.0, no negative
    for d in _both(_soft_case(), policy):
        assert d.trajectories[1].advantage == pytest.approx(wrong_answer, rel=1e-5)
        assert d.trajectories[2].advantage == 0.0


def test_the_wire_policy_carries_masked_in_baseline() -> None:
    assert CurationPolicySpec(name="p").to_policy().masked_in_baseline is False
    spec = CurationPolicySpec.model_validate({"name": "p", "masked_in_baseline": True})
    assert spec.to_policy().masked_in_baseline is True
    assert CurationPolicySpec.from_policy("p", spec.to_policy()).masked_in_baseline is True
