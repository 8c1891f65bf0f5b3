"""Advantage estimators: the worked check, loop references, batched == per group, properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filters.advantages import (
    ESTIMATORS,
    batched_advantages,
    compute_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    rloo_advantages,
)
from filters.types import AdvantageConfig

WORKED = [0.9, 0.6, 0.2, 0.0]
CONFIGS = [
    AdvantageConfig("grpo", "population"),
    AdvantageConfig("grpo", "unbiased"),
    AdvantageConfig("grpo", "population", eps=0.0),
    AdvantageConfig("dr_grpo"),
    AdvantageConfig("rloo"),
]
rewards_st = st.lists(st.floats(min_value=-100, max_value=100, allow_nan=False), min_size=1, max_size=16)


def loop_reference(rewards: list[float], cfg: AdvantageConfig) -> list[float]:
    """The formulas written out with Python loops, one member at a time."""
    g = len(rewards)
    mean = sum(rewards) / g
    if cfg.estimator == "dr_grpo":
        return [r - mean for r in rewards]
    if cfg.estimator == "rloo":
        if g < 2:
            return [0.0] * g
        return [r - (sum(rewards) - r) / (g - 1) for r in rewards]
    ddof = 0 if cfg.std == "population" else 1
    if g <= ddof:
        return [0.0] * g
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (g - ddof))
    if std <= 1e-12 * max(abs(r) for r in rewards):  # rounding-level spread is no spread
        return [0.0] * g
    return [(r - mean) / (std + cfg.eps) for r in rewards]


class TestWorkedCheck:
    def test_grpo_population(self) -> None:
        adv = grpo_advantages(np.array(WORKED))
        assert np.round(adv, 2).tolist() == [1.36, 0.50, -0.64, -1.22]

    def test_grpo_unbiased(self) -> None:
        adv = grpo_advantages(np.array(WORKED), std="unbiased")
        assert np.round(adv, 2).tolist() == [1.18, 0.43, -0.56, -1.05]

    def test_rloo(self) -> None:
        adv = rloo_advantages(np.array(WORKED))
        assert np.round(adv, 3).tolist() == [0.633, 0.233, -0.300, -0.567]

    def test_dr_grpo(self) -> None:
        adv = dr_grpo_advantages(np.array(WORKED))
        np.testing.assert_allclose(adv, [0.475, 0.175, -0.225, -0.425])

    def test_statistics(self) -> None:
        r = np.array(WORKED)
        assert r.mean() == pytest.approx(0.425)
        assert r.std() == pytest.approx(0.349, abs=5e-4)


class TestEdgeCases:
    @pytest.mark.parametrize("cfg", CONFIGS, ids=repr)
    def test_all_equal_gives_zero(self, cfg: AdvantageConfig) -> None:
        adv = compute_advantages(np.array([0.7, 0.7, 0.7]), cfg)
        np.testing.assert_allclose(adv, 0.0, atol=1e-9)
        assert not np.isnan(adv).any()

    @pytest.mark.parametrize("cfg", CONFIGS, ids=repr)
    def test_group_of_one_gives_zero(self, cfg: AdvantageConfig) -> None:
        assert compute_advantages(np.array([1.0]), cfg).tolist() == [0.0]

    def test_binary_group(self) -> None:
        adv = grpo_advantages(np.array([1.0, 0.0, 0.0, 1.0]))
        np.testing.assert_allclose(adv, [1, -1, -1, 1], atol=1e-5)
        np.testing.assert_allclose(rloo_advantages(np.array([1.0, 0, 0, 1])), [2 / 3, -2 / 3, -2 / 3, 2 / 3])

    @pytest.mark.parametrize("name", sorted(ESTIMATORS))
    def test_nan_raises(self, name: str) -> None:
        with pytest.raises(ValueError, match="NaN"):
            compute_advantages(np.array([1.0, np.nan]), AdvantageConfig(name))  # type: ignore[arg-type]

    def test_batched_nan_in_valid_entry_raises(self) -> None:
        with pytest.raises(ValueError, match="NaN"):
            batched_advantages(np.array([[1.0, np.nan]]), np.array([[True, True]]), AdvantageConfig())

    def test_batched_nan_in_padding_is_ignored(self) -> None:
        adv = batched_advantages(
            np.array([[1.0, 0.0, np.nan]]), np.array([[True, True, False]]), AdvantageConfig()
        )
        np.testing.assert_allclose(adv, [[1.0, -1.0, 0.0]], atol=1e-5)

    def test_unknown_names_raise_listing_valid(self) -> None:
        with pytest.raises(ValueError, match="grpo, dr_grpo, rloo"):
            AdvantageConfig("ppo")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="population, unbiased"):
            grpo_advantages(np.array([1.0, 0.0]), std="sample")  # type: ignore[arg-type]

    def test_baseline_mask_keeps_member_in_statistics(self) -> None:
        rewards = np.array([1.0, 0.0, 0.0, 1.0])
        masked = np.array([False, False, False, True])
        adv = compute_advantages(rewards, AdvantageConfig("dr_grpo"), masked)
        np.testing.assert_allclose(adv, [0.5, -0.5, -0.5, 0.0])
        adv = compute_advantages(rewards, AdvantageConfig("rloo"), masked)
        np.testing.assert_allclose(adv, [1 - 1 / 3, -2 / 3, -2 / 3, 0.0])


@pytest.mark.parametrize("cfg", CONFIGS, ids=repr)
@pytest.mark.parametrize(
    "rewards", [WORKED, [1.0, 0.0, 0.0, 1.0], [0.5], [3.0, 3.0], [-2.0, 5.0, 1.0, 1.0, 0.0, 7.5, -1.0, 2.0]]
)
def test_vectorised_matches_loop_reference(cfg: AdvantageConfig, rewards: list[float]) -> None:
    np.testing.assert_allclose(
        compute_advantages(np.array(rewards), cfg), loop_reference(rewards, cfg), atol=1e-9
    )


@settings(max_examples=150, deadline=None)
@given(groups=st.lists(rewards_st, min_size=1, max_size=6), cfg=st.sampled_from(CONFIGS))
def test_batched_matches_per_group(groups: list[list[float]], cfg: AdvantageConfig) -> None:
    width = max(len(g) for g in groups) + 1
    rewards = np.full((len(groups), width), 123.0)
    valid = np.zeros_like(rewards, dtype=bool)
    for b, g in enumerate(groups):
        rewards[b, : len(g)] = g
        valid[b, : len(g)] = True
    batched = batched_advantages(rewards, valid, cfg)
    for b, g in enumerate(groups):
        np.testing.assert_allclose(batched[b, : len(g)], loop_reference(g, cfg), rtol=1e-7, atol=1e-7)
        assert (batched[b, len(g) :] == 0).all()


@settings(max_examples=150, deadline=None)
@given(rewards=rewards_st, cfg=st.sampled_from(CONFIGS))
def test_per_group_matches_loop_reference(rewards: list[float], cfg: AdvantageConfig) -> None:
    adv = compute_advantages(np.array(rewards), cfg)
    np.testing.assert_allclose(adv, loop_reference(rewards, cfg), rtol=1e-7, atol=1e-7)


@settings(max_examples=150, deadline=None)
@given(rewards=rewards_st, cfg=st.sampled_from(CONFIGS[:4]))
def test_grpo_and_dr_grpo_sum_to_zero(rewards: list[float], cfg: AdvantageConfig) -> None:
    adv = compute_advantages(np.array(rewards), cfg)
    scale = max(1.0, float(np.abs(adv).max()))
    assert abs(adv.sum()) <= 1e-9 * scale * len(rewards)


@settings(max_examples=150, deadline=None)
@given(rewards=rewards_st, shift=st.floats(-50, 50), cfg=st.sampled_from(CONFIGS))
def test_shift_invariance(rewards: list[float], shift: float, cfg: AdvantageConfig) -> None:
    r = np.array(rewards)
    base, shifted = compute_advantages(r, cfg), compute_advantages(r + shift, cfg)
    if cfg.estimator == "grpo" and r.std() < 1e-3:
        return  # std + eps amplifies rounding when the spread is at the rounding scale
    np.testing.assert_allclose(shifted, base, rtol=1e-6, atol=1e-6)


@settings(max_examples=150, deadline=None)
@given(rewards=rewards_st, scale=st.floats(0.1, 100))
def test_grpo_scale_invariance(rewards: list[float], scale: float) -> None:
    r = np.array(rewards)
    cfg = AdvantageConfig("grpo", eps=0.0)
    np.testing.assert_allclose(
        compute_advantages(r * scale, cfg), compute_advantages(r, cfg), rtol=1e-6, atol=1e-6
    )


@settings(max_examples=100, deadline=None)
@given(rewards=st.lists(st.floats(-10, 10), min_size=2, max_size=16))
def test_rloo_is_scaled_dr_grpo(rewards: list[float]) -> None:
    r = np.array(rewards)
    g = len(rewards)
    np.testing.assert_allclose(rloo_advantages(r), g / (g - 1) * dr_grpo_advantages(r), atol=1e-9)
