"""filters.monitors: every monitor against hand-computed windows; each vectorised helper against a loop."""

from __future__ import annotations

import math
import random
import zlib

import numpy as np
import pytest

from filters import monitors as m
from filters.monitors import ComponentFact, GroupFact, Thresholds, TrajectoryFact


# -- loop references ----------------------------------------------------------------------------------
def loop_group_corr(lengths, rewards, groups):
    out = []
    for key in dict.fromkeys(groups):
        xs = [x for x, g in zip(lengths, groups, strict=True) if g == key]
        ys = [y for y, g in zip(rewards, groups, strict=True) if g == key]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
        sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
        if sxx > 1e-12 and syy > 1e-12:
            out.append(sxy / math.sqrt(sxx * syy))
    return sum(out) / len(out) if out else None


def loop_spike_z(xs, min_trailing=m.SPIKE_MIN_TRAILING):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if len(xs) < min_trailing + 1:
        return None
    trailing = xs[:-1]
    mean = sum(trailing) / len(trailing)
    std = math.sqrt(sum((x - mean) ** 2 for x in trailing) / len(trailing))
    std = max(std, m.SPIKE_STD_FLOOR * abs(mean), 1e-12)
    return max(0.0, (xs[-1] - mean) / std)


def loop_relative_drop(xs, baseline=m.BASELINE, recent=m.RECENT):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if len(xs) < baseline + recent:
        return None
    before = sum(xs[:baseline]) / baseline
    return None if before <= 0 else max(0.0, 1 - (sum(xs[-recent:]) / recent) / before)


@pytest.mark.parametrize("seed", range(8))
def test_group_corr_matches_the_loop(seed):
    rng = random.Random(seed)
    groups = [rng.randrange(5) for _ in range(40)]
    lengths = [float(rng.randrange(1, 50)) for _ in groups]
    rewards = [float(rng.random() < 0.5) for _ in groups]
    got = m.group_corr(np.asarray(lengths), np.asarray(rewards), np.asarray(groups))
    want = loop_group_corr(lengths, rewards, groups)
    assert (got is None and want is None) or np.allclose(got, want)


@pytest.mark.parametrize("seed", range(8))
def test_spike_and_drop_match_the_loop(seed):
    rng = random.Random(seed)
    xs = [rng.gauss(1.0, 0.1) for _ in range(rng.randrange(5, 30))] + [None, float("nan")]
    for fast, slow in ((m.spike_z, loop_spike_z), (m.relative_drop, loop_relative_drop)):
        got, want = fast(xs), slow(xs)
        assert (got is None and want is None) or np.allclose(got, want)


def test_group_corr_hand_computed():
    # group a: length up, reward up (corr 1); group b: [1, 0, 0, 1] rewards against lengths 1..4 (corr 0);
    # group c: all-equal rewards (no spread, left out); group d: one member (left out)
    lengths = np.array([1, 2, 1, 2, 3, 4, 5, 6, 7, 8.0])
    rewards = np.array([0, 1, 1, 0, 0, 1, 1, 1, 1, 0.0])
    groups = np.array(["a", "a", "b", "b", "b", "b", "c", "c", "c", "d"])
    assert m.group_corr(lengths, rewards, groups) == pytest.approx((1.0 + 0.0) / 2)
    assert m.group_corr(np.array([1.0, 2.0]), np.array([1.0, 1.0]), np.array([0, 0])) is None


# -- monitors over hand-computed windows ----------------------------------------------------------------
def test_entropy_collapse_relative_drop():
    # baseline mean(first 5) = 1.0; recent mean(last 3) = (0.5 + 0.4 + 0.3) / 3 = 0.4 -> drop 0.6: warning
    r = m.evaluate("entropy_collapse", {"entropy": [1.0] * 5 + [0.9, 0.5, 0.4, 0.3]})
    assert r.value == pytest.approx(0.6) and r.state == "warning" and r.threshold == 0.5
    r = m.evaluate("entropy_collapse", {"entropy": [1.0] * 5 + [0.1, 0.1, 0.1]})
    assert r.value == pytest.approx(0.9) and r.state == "critical" and r.threshold == 0.8
    assert m.evaluate("entropy_collapse", {"entropy": [1.0] * 7}).state == "ok"  # too short: None
    assert m.evaluate("entropy_collapse", {"entropy": [1.0] * 7}).value is None


def test_kl_spike_counts_sigmas_over_the_trailing_window():
    # trailing [1, 3] * 5: mean 2, std 1; last 9 -> z 7 (>= 6 warning, < 10 critical)
    r = m.evaluate("kl_spike", {"kl_ref": [1.0, 3.0] * 5 + [9.0]})
    assert r.value == pytest.approx(7.0) and r.state == "warning"
    assert m.evaluate("kl_spike", {"kl_ref": [1.0, 3.0] * 5 + [13.0]}).state == "critical"  # z 11
    assert m.evaluate("kl_spike", {"kl_ref": [1.0, 3.0] * 5 + [-20.0]}).value == 0.0  # downward: not a spike
    # a flat trailing series: std floored at 5% of the mean, so a 10% wiggle is z 2, not infinity
    assert m.evaluate("kl_spike", {"kl_ref": [1.0] * 10 + [1.1]}).value == pytest.approx(2.0)


def test_level_monitors_average_the_last_three():
    r = m.evaluate("error_rate", {"error_share": [0.0, 0.0, 0.9, 0.04, 0.05, 0.09]})
    assert r.value == pytest.approx(0.06) and r.state == "warning"
    assert m.evaluate("error_rate", {"error_share": [0.3, None, 0.3, 0.3]}).state == "critical"
    assert m.evaluate("clip_fraction", {"clip_frac": [0.1, 0.1]}).value is None


def test_length_hacking_needs_a_flat_outcome():
    length = [100.0] * 5 + [150, 200, 250]  # recent 200 / baseline 100 -> rise 1.0: critical
    flat = {"mean_length": length, "mean_outcome": [0.5] * 8, "length_reward_corr": [0.3] * 8}
    r = m.evaluate("length_hacking", flat)
    assert r.value == pytest.approx(1.0) and r.state == "critical"
    paying = {**flat, "mean_outcome": [0.3] * 5 + [0.4, 0.5, 0.6]}  # outcome +0.2: learning, not hacking
    assert m.evaluate("length_hacking", paying).value == 0.0
    anti = {**flat, "length_reward_corr": [-0.5] * 8}  # longer answers score less: not paid for length
    assert m.evaluate("length_hacking", anti).value == 0.0


def test_component_dominance_needs_a_flat_outcome():
    series = {"dominance": [0.9] * 8, "mean_outcome": [0.2] * 8}
    assert m.evaluate("component_dominance", series).state == "critical"
    series["mean_outcome"] = [0.2] * 5 + [0.5] * 3
    assert m.evaluate("component_dominance", series).value == 0.0


def test_thresholds_are_validated_and_overridable():
    with pytest.raises(ValueError, match="above critical"):
        Thresholds(0.5, 0.1)
    with pytest.raises(ValueError, match="expected one of"):
        m.evaluate("nope", {})
    r = m.evaluate("error_rate", {"error_share": [0.06] * 3}, Thresholds(0.01, 0.06))
    assert r.state == "critical" and r.threshold == 0.06


def test_every_contract_monitor_has_documented_defaults():
    assert set(m.MONITOR_NAMES) == set(m.MONITORS) and len(m.MONITOR_NAMES) == 14
    for spec in m.MONITORS.values():
        assert spec.warning <= spec.critical and spec.source


# -- per-version inputs ---------------------------------------------------------------------------------
def test_repetition_uses_the_zlib_ratio_of_the_tail():
    looped = "the answer is " * 2000
    data = looped[-m.ZLIB_TAIL_CHARS:].encode()
    assert m.zlib_ratio(looped) == pytest.approx(len(data) / len(zlib.compress(data)))
    assert m.is_repetitive(looped)
    rng = random.Random(0)
    noise = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 ") for _ in range(5000))
    assert not m.is_repetitive(noise)
    assert not m.is_repetitive("ok ok ok ok")  # short: not judged
    assert m.repeated_ngram_share("a b c d a b c d") == pytest.approx(1 - 4 / 5)


def _t(tokens=10, reason="stop", outcome=1.0, total=1.0, comps=(), text="x"):
    return TrajectoryFact(tokens, reason, text, outcome, total, tuple(comps))


def test_summarize_hand_computed_version():
    fmt = lambda v: ComponentFact("fmt", "rule.format", v, 0.5)  # noqa: E731
    out = lambda v: ComponentFact("acc", "verifier.math", v, 1.0, outcome=True)  # noqa: E731
    judge = lambda v: ComponentFact("j", "judge.llm", v, 0.0)  # noqa: E731
    g1 = GroupFact(3, (_t(10, outcome=1.0, comps=[out(1), fmt(1), judge(1)]),
                       _t(30, "length", outcome=0.0, total=0.0, comps=[out(0), fmt(0), judge(1)])), scored=True)
    g2 = GroupFact(3, (_t(20, "env_error", total=None, outcome=None),
                       _t(20, outcome=0.0, total=0.0, comps=[out(0), fmt(1)])), scored=True, zero_variance=True)
    g3 = GroupFact(3, (_t(40),), stale=True)
    s = m.summarize([g1, g2, g3])[3]
    assert s.n_groups == 3
    assert s.mean_length == pytest.approx((10 + 30 + 20 + 20 + 40) / 5)
    assert s.mean_outcome == pytest.approx(1 / 3)
    assert s.truncation_share == pytest.approx(1 / 5) and s.error_share == pytest.approx(1 / 5)
    assert s.stale_share == pytest.approx(1 / 3) and s.zero_variance_share == pytest.approx(1 / 2)
    assert s.format_pass_rate == pytest.approx(2 / 3)
    assert s.judge_disagreement == pytest.approx(1 / 2)  # g1's second: verifier 0, judge 1
    # |w*v| sums: acc 1, fmt 0.5 + 0.5 = 1.0 (judge weight 0) -> the shaped fmt carries 1 / 2
    assert s.dominance == pytest.approx(0.5)
    assert s.length_reward_corr == pytest.approx(-1.0)  # g1: 10 -> 1, 30 -> 0; g2 has one scored member


def test_window_series_reads_trainer_metrics_and_skips_garbage():
    metrics = {1: {"entropy": 1.0, "clip_frac_low": 0.1, "clip_frac_high": 0.05}, 2: {"entropy": "x"}}
    s = m.window_series([1, 2, 3], {}, metrics)
    assert s["entropy"] == [1.0, None, None]
    assert s["clip_frac"][0] == pytest.approx(0.15) and s["clip_frac"][1] is None
    assert s["mean_length"] == [None, None, None]


def test_extreme_finite_values_give_a_finite_value_or_none():
    # Attack: a trainer publishes kl_ref 1.7e308 after a calm window: z overflows to inf (not JSON)
    r = m.evaluate("kl_spike", {"kl_ref": [0.02] * 10 + [1.7e308]})
    assert r.state == "critical" and math.isfinite(r.value)
    r = m.evaluate("kl_spike", {"kl_ref": [1.7e308, -1.7e308] * 5 + [1.0]})  # mean / std overflow: no value
    assert r.value is None or math.isfinite(r.value)
    r = m.evaluate("clip_fraction", {"clip_frac": [1.7e308] * 3})
    assert math.isfinite(r.value) and r.state == "critical"
