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


def _loop_median(xs):
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else (ys[n // 2 - 1] + ys[n // 2]) / 2


def _loop_robust(xs):
    med = _loop_median(xs)
    mad = _loop_median([abs(x - med) for x in xs])
    return med, max(m.MAD_NORMAL * mad, m.SPIKE_STD_FLOOR * abs(med), 1e-12)


def loop_spike_z(xs, min_trailing=m.SPIKE_MIN_TRAILING, recent=1):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if len(xs) < min_trailing + 1:
        return None
    best = 0.0
    for i in range(max(min_trailing, len(xs) - recent), len(xs)):
        med, scale = _loop_robust(xs[:i])
        start = i
        while start > min_trailing and (xs[start - 1] - med) / scale >= m.SPIKE_RUN_Z:
            start -= 1
        if start < i:
            med, scale = _loop_robust(xs[:start])
        best = max(best, (xs[i] - med) / scale)
    return best


def loop_relative_drop(xs, baseline=m.BASELINE, recent=m.RECENT):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if len(xs) < baseline + recent:
        return None
    before = sum(xs[:baseline]) / baseline
    now = sum(min(x, before) for x in xs[-recent:]) / recent
    return None if before <= 0 else max(0.0, 1 - now / before)


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
    assert m.evaluate("entropy_collapse", {"entropy": [1.0] * 7}).state == "ok"  # too short for a drop:
    assert m.evaluate("entropy_collapse", {"entropy": [1.0] * 7}).value == pytest.approx(0.5 * 0.05)  # the level
    assert m.relative_drop([1.0] * 7) is None


def test_kl_spike_counts_robust_sigmas_over_the_trailing_window():
    # trailing [1, 3] * 5: median 2, MAD 1, scale 1.4826; last 12 -> z 10 / 1.4826 = 6.745 (warning)
    r = m.evaluate("kl_spike", {"kl_ref": [1.0, 3.0] * 5 + [12.0]})
    assert r.value == pytest.approx(10 / 1.4826) and r.state == "warning"
    assert m.evaluate("kl_spike", {"kl_ref": [1.0, 3.0] * 5 + [17.0]}).state == "critical"  # z 10.117
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
    anti = {**flat, "length_reward_corr": [-0.5] * 8}  # longer answers score less: no verdict (held)
    held = m.evaluate("length_hacking", anti)
    assert held.value is None and held.state == "ok" and held.evidence["length_rise"] == pytest.approx(1.0)


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


def test_one_old_outlier_does_not_hide_a_later_spike():
    # [1, 2] * 15 with one 2 made 1e6 (15 ones, 14 twos, 1e6): median 1.5, MAD 0.5, scale 0.7413, as without it
    xs = [1.0, 2.0] * 15
    xs[3] = 1e6
    assert m.spike_z([*xs, 10.0]) == pytest.approx(8.5 / (1.4826 * 0.5))  # 11.466, critical
    assert m.evaluate("grad_norm_spike", {"grad_norm": [*xs, 10.0]}).state == "critical"


def test_a_two_version_spike_is_not_its_own_baseline():
    # the second 50: the first 50 (z 980 against median 1, scale floored at 0.05) is the spike run,
    # excluded: z = (50 - 1) / 0.05 = 980 again (the mean / std of old scored it 5.29)
    assert m.spike_z([1.0] * 30 + [50.0, 50.0]) == pytest.approx(980.0)
    # noisy baseline: [1, 2] * 15 then 10, 10: both z 11.466
    assert m.spike_z([1.0, 2.0] * 15 + [10.0, 10.0]) == pytest.approx(8.5 / 0.7413)


def test_a_spike_between_evaluations_is_seen_with_recent():
    xs = [1.0, 2.0] * 15 + [10.0, 1.5, 1.5]  # the spike two versions before the evaluation
    assert m.spike_z(xs) == 0.0  # only the last value: missed
    assert m.spike_z(xs, recent=3) == pytest.approx(8.5 / 0.7413)
    assert m.evaluate("kl_spike", {"kl_ref": xs}, recent=3).state == "critical"
    assert m.evaluate("kl_spike", {"kl_ref": xs}, recent=2).state == "ok"  # it is not new


@pytest.mark.parametrize("seed", range(6))
def test_spike_with_recent_matches_the_loop(seed):
    rng = random.Random(seed)
    xs = [rng.gauss(1.0, 0.1) for _ in range(rng.randrange(11, 40))]
    for j in rng.sample(range(len(xs)), 3):
        xs[j] *= rng.choice([5.0, 50.0])
    for recent in (1, 2, 5):
        assert np.allclose(m.spike_z(xs, recent=recent), loop_spike_z(xs, recent=recent))


def test_extreme_finite_values_give_a_finite_value_or_none():
    # Attack: a trainer publishes kl_ref 1.7e308 after a calm window: z overflows to inf (not JSON)
    r = m.evaluate("kl_spike", {"kl_ref": [0.02] * 10 + [1.7e308]})
    assert r.state == "critical" and math.isfinite(r.value)
    r = m.evaluate("kl_spike", {"kl_ref": [1.7e308, -1.7e308] * 5 + [1.0]})  # mean / std overflow: no value
    assert r.value is None or math.isfinite(r.value)
    r = m.evaluate("clip_fraction", {"clip_frac": [1.7e308] * 3})
    assert math.isfinite(r.value) and r.state == "critical"


def test_one_large_value_does_not_silence_entropy_collapse():
    """A single large value among collapsed ones (a plain mean read [.001, .001, 3.0] as 1.0: ok) does not hide
    the collapse: the drop caps recent values at the baseline, the floor reads the median of the last three."""
    # the drop alone: capped [.2, .2, 1.0] -> 1 - 0.4667 = 0.533 (warning; the plain mean said no drop)
    assert m.relative_drop([1.0] * 5 + [0.2, 0.2, 3.0]) == pytest.approx(1 - 1.4 / 3)
    r = m.evaluate("entropy_collapse", {"entropy": [1.0] * 5 + [0.2, 0.2, 3.0]})
    assert r.state == "warning"
    # collapsed below the critical floor: the median level 0.001 decides, critical
    r = m.evaluate("entropy_collapse", {"entropy": [1.0] * 5 + [0.001, 0.001, 3.0]})
    assert r.state == "critical" and r.evidence["entropy_level"] == pytest.approx(0.001)
    assert m.evaluate("entropy_collapse", {"entropy": [0.001, 0.001, 3.0]}).state == "critical"  # no baseline
    # two values back up: recovered (capped mean 0.667 -> drop 0.333, median level 1.0)
    assert m.evaluate("entropy_collapse", {"entropy": [1.0] * 5 + [0.001, 1.0, 1.0]}).state == "ok"
    assert m.recent_median([1.0, None, 5.0, float("nan"), 2.0]) == 2.0 and m.recent_median([1.0, 2.0]) is None


def test_entropy_collapse_absolute_level_counts_when_there_is_no_drop_to_see():
    w, c = m.MONITORS["entropy_collapse"].warning, m.MONITORS["entropy_collapse"].critical  # 0.5, 0.8
    fw, fc = m.ENTROPY_FLOOR  # 0.05, 0.01 nats per token
    # collapsed before the window began: flat (no drop), but the level is at the critical floor
    r = m.evaluate("entropy_collapse", {"entropy": [0.01] * 10})
    assert r.state == "critical" and r.value == c and r.evidence["entropy_level"] == pytest.approx(0.01)
    assert (r.evidence["entropy_floor_warning"], r.evidence["entropy_floor_critical"]) == (fw, fc)
    # too few versions for a drop (3 < 5 + 3), the level alone decides
    assert m.evaluate("entropy_collapse", {"entropy": [0.0, 0.0, 0.0]}).state == "critical"
    # halfway between the floors: w + (c - w) / 2 = 0.65 -> warning
    r = m.evaluate("entropy_collapse", {"entropy": [0.03] * 3})
    assert r.value == pytest.approx(w + (c - w) * (fw - 0.03) / (fw - fc)) and r.state == "warning"
    # exactly at the warning floor: w; above it w * fw / level, far below warning for a healthy level
    assert m.evaluate("entropy_collapse", {"entropy": [fw] * 3}).value == pytest.approx(w)
    r = m.evaluate("entropy_collapse", {"entropy": [1.0] * 8})
    assert r.state == "ok" and r.value == pytest.approx(w * fw / 1.0)
    # the larger of the two: a relative drop 1.0 -> 0.1 (0.9, critical) at a level above the floor (0.25)
    r = m.evaluate("entropy_collapse", {"entropy": [1.0] * 5 + [0.1] * 3})
    assert r.value == pytest.approx(0.9) and r.state == "critical"
    # the floors map onto the thresholds in force (set per deployment)
    r = m.evaluate("entropy_collapse", {"entropy": [0.0] * 3}, m.Thresholds(2.0, 3.0))
    assert r.value == 3.0 and r.state == "critical"
    assert m.evaluate("entropy_collapse", {"entropy": [None, 0.5]}).value is None  # no level, no drop


def test_floor_severity_hand_computed():
    t = m.Thresholds(0.5, 0.8)
    assert m.floor_severity(None, (0.05, 0.01), t) is None
    assert m.floor_severity(-1.0, (0.05, 0.01), t) == 0.8
    assert m.floor_severity(0.01, (0.05, 0.01), t) == 0.8
    assert m.floor_severity(0.02, (0.05, 0.01), t) == pytest.approx(0.5 + 0.3 * 0.75)
    assert m.floor_severity(0.1, (0.05, 0.01), t) == pytest.approx(0.25)
    # hysteresis: resolving needs severity < 0.5 * 0.8 = 0.4 -> level > 0.05 / 0.8 = 0.0625
    assert m.floor_severity(0.06, (0.05, 0.01), t) > 0.4 > m.floor_severity(0.065, (0.05, 0.01), t)


def test_length_hacking_is_not_hidden_by_outcome_noise_or_a_weak_correlation():
    length = [100.0] * 5 + [150, 200, 250]  # rise 1.0
    # a noisy flat outcome: first 5 (0.4, 0.6, 0.4, 0.6, 0.5) mean 0.5, last 3 (0.7, 0.5, 0.6) mean 0.6:
    # gain 0.1 > 0.05, but se = sqrt(0.01 / 5 + 0.01 / 3) = 0.0730 -> tolerance 2 se = 0.146: noise
    noisy = [0.4, 0.6, 0.4, 0.6, 0.5, 0.7, 0.5, 0.6]
    assert m.gain_tolerance(noisy) == pytest.approx(2 * math.sqrt(0.01 / 5 + 0.01 / 3))
    r = m.evaluate("length_hacking", {"mean_length": length, "mean_outcome": noisy, "length_reward_corr": [-0.1] * 8})
    assert r.value == pytest.approx(1.0) and r.state == "critical"  # -0.1: not below -0.2
    assert m.evaluate("length_hacking", {"mean_length": length, "mean_outcome": noisy,
                                         "length_reward_corr": [-0.3] * 8}).value is None  # held
    # the same gain on a steady outcome is real: learning, not hacking
    steady = [0.5] * 5 + [0.6] * 3
    assert m.gain_tolerance(steady) == m.OUTCOME_TOLERANCE
    assert m.evaluate("length_hacking", {"mean_length": length, "mean_outcome": steady}).value == 0.0
    assert m.gain_tolerance([0.5] * 7) == m.OUTCOME_TOLERANCE  # too short for a gain


def test_length_hacking_goes_ok_warning_critical_through_a_noisy_anti_correlation():
    """A hand-computed run through the monitor and the real state machine (window of 8 versions): the
    length climbs on a flat outcome; two versions of within-group anti-correlation (noise, below -0.2) hold
    the open warning instead of resolving it (and starting the cooldown), so the run still goes critical."""
    from service.alerts import machine

    rule = machine.Policy()  # resolve below 0.5 * 0.8, cooldown 5
    base = [100.0] * 5  # baseline mean 100
    steps = [  # (last 3 lengths, recent corr) -> rise = mean(last 3) / 100 - 1
        ([100, 100, 100], 0.1, 0.0, "ok"),  # rise 0
        ([120, 140, 160], 0.1, 0.4, "ok"),  # 140 / 100 - 1 = 0.4 < 0.5
        ([140, 160, 180], 0.1, 0.6, "warning"),  # 160 / 100 - 1 = 0.6
        ([160, 180, 200], -0.3, None, "warning"),  # rise 0.8, but corr -0.3: held (was: 0 -> resolved)
        ([180, 200, 220], -0.25, None, "warning"),  # rise 1.0, held
        ([200, 220, 240], 0.0, 1.2, "critical"),  # 220 / 100 - 1 = 1.2 >= 1
    ]
    state, resolved = "ok", None
    for v, (last3, corr, want_value, want_state) in enumerate(steps, start=1):
        series = {"mean_length": base + last3, "mean_outcome": [0.5] * 8, "length_reward_corr": [corr] * 8}
        r = m.evaluate("length_hacking", series)
        if want_value is None:
            assert r.value is None
        else:
            assert r.value == pytest.approx(want_value)
        assert r.evidence["length_rise"] == pytest.approx(sum(last3) / 300 - 1)
        to = machine.step(state, r.state, r.value, 0.5, rule, machine.cooling(resolved, v, rule))
        assert to != "resolved"
        state = to or state
        assert state == want_state, v
    # a real outcome gain still zeroes the value, and an open alert resolves
    paid = {"mean_length": base + [200, 220, 240], "mean_outcome": [0.3] * 5 + [0.6] * 3}
    r = m.evaluate("length_hacking", paid)
    assert r.value == 0.0 and machine.step("critical", r.state, r.value, 0.5, rule) == "resolved"
