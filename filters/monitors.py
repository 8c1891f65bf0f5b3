"""Training-health monitors: pure functions over plain per-version data (issue 24).

Two layers, both free of the database:

- ``summarize(groups)``: the stored groups of a window (``GroupFact`` records) -> one ``VersionStats``
  per sampler policy version (mean response length, outcome, the share of repetitive answers, ...);
  ``StatsCache`` makes it incremental as the window slides (only versions whose groups changed are computed).
- ``evaluate(name, series, thresholds)``: one monitor over a window of per-version values (oldest
  first) -> ``MonitorResult(value, state, threshold, evidence)``. Every monitor's value is oriented so
  that *higher is worse*; ``state`` is ``critical`` when value >= critical, ``warning`` when >= warning.

Monitor kinds (``MonitorSpec.kind``):
- ``level``: the mean of the last ``RECENT`` values (a rate: clip fraction, error share, ...).
- ``drop``: relative drop ``1 - mean(min(last RECENT, before)) / before``, ``before = mean(first
  BASELINE)``, of a quantity that should not fall (entropy, a format component's pass rate). A recent value
  above the baseline counts as the baseline, so one large value among collapsed ones does not read as a
  recovery (the plain mean of ``[.001, .001, 3.0]`` is 1.0: no drop; capped it is a drop of 2/3). With a
  ``floor`` (entropy: ``ENTROPY_FLOOR``) the absolute level counts too: the value is the larger of the drop
  and ``floor_severity`` of the recent level, the *median* of the last ``RECENT`` values (one outlier does
  not lift it), so a run whose entropy is already collapsed when the window starts (no drop left to see, or
  fewer versions than a drop needs) still alerts, and stays open while the level stays down.
- ``spike``: a robust upward z-score, ``(x - median(trailing)) / (1.4826 * MAD(trailing))`` (KL to the
  reference, gradient norm), of every value since the last evaluation (``recent``; the worst counts), the
  trailing window being the values before it less the current spike run (the values just before it that
  are themselves ``SPIKE_RUN_Z`` above it): one old outlier does not inflate the scale for the window, a
  two-version spike is not its own baseline, and a spike between two evaluations is still seen. The
  scale is floored at ``SPIKE_STD_FLOOR`` of the trailing median so a flat series does not turn noise
  into infinite z.
- ``rise_flat``: length hacking. The relative rise of the mean response length (last ``RECENT`` vs first
  ``BASELINE``); 0 when the outcome really gained (more than ``gain_tolerance``: ``OUTCOME_TOLERANCE``, or
  ``OUTCOME_GAIN_SE`` standard errors of the gain when the outcome is noisier): the length pays off, an
  open alert resolves. When instead length anti-correlates with reward inside groups (below
  ``-LENGTH_CORR_TOLERANCE``) the value is None ("held": no verdict this version, the alert keeps its
  state). The mean within-group correlation of a few small groups is noisy: in bench.reward_hacking's
  length run (4 groups of 4 a version, length unrelated to reward) it dipped below -0.2 for 2-3 versions
  right after the warning (seeds 0-2); a 0 there used to resolve the warning and start the cooldown, so
  the run never went critical although its length tripled.
- ``level_flat``: component dominance. The recent share of the total carried by one shaped component,
  unless the outcome really gained (``gain_tolerance``); 0 then.

Default thresholds: ``MONITORS[name].source`` says where each comes from; most are ours (marked "ours").
"""

from __future__ import annotations

import math
import sys
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np

from filters.types import BUDGET_REASONS, ENVIRONMENT_REASONS

MonitorName = Literal[
    "entropy_collapse", "kl_spike", "clip_fraction", "grad_norm_spike", "behaviour_mismatch",
    "length_hacking", "repetition", "format_collapse", "component_dominance", "judge_disagreement",
    "zero_variance_saturation", "truncation_rate", "error_rate", "stale_rate",
]
MONITOR_NAMES: tuple[str, ...] = get_args(MonitorName)
MonitorKind = Literal["level", "drop", "spike", "rise_flat", "level_flat"]
State = Literal["ok", "warning", "critical"]

RECENT = 3  # values averaged as "now"
BASELINE = 5  # oldest values of the window averaged as "before"
SPIKE_MIN_TRAILING = 10  # a spike needs this many earlier values
SPIKE_STD_FLOOR = 0.05  # relative to |trailing median|
MAD_NORMAL = 1.4826  # MAD -> standard deviation for normal data
SPIKE_RUN_Z = 3.0  # ours: a trailing value this far above the baseline belongs to the spike run
OUTCOME_TOLERANCE = 0.05  # an outcome gain above this means the change pays off (not hacking)
OUTCOME_GAIN_SE = 2.0  # ... and above this many standard errors of the gain (ours: noise is not a gain)
LENGTH_CORR_TOLERANCE = 0.2  # length "anti-correlates" with reward below -this (ours: noise is not a sign)
# slime's repetition check (as cited in issue 24): zlib ratio of the last 10k characters > 10, long texts
ZLIB_TAIL_CHARS = 10_000
ZLIB_RATIO = 10.0
ZLIB_MIN_CHARS = 1_000  # "long": ours
NGRAM = 4
NGRAM_REPEAT_SHARE = 0.5  # share of a text's word 4-grams that repeat an earlier one (ours)
NGRAM_MIN_WORDS = 50  # ours
# absolute entropy floor in nats per token (warning, critical): ours. RL on reasoning models is reported to
# drive the policy entropy towards 0 early in training (Cui et al. 2025, "The Entropy Mechanism of
# Reinforcement Learning for Reasoning Language Models"); healthy runs stay well above these.
ENTROPY_FLOOR = (0.05, 0.01)


@dataclass(frozen=True)
class MonitorSpec:
    kind: MonitorKind
    series: str  # the VersionStats field / trainer metric it reads
    warning: float
    critical: float
    source: str
    floor: tuple[float, float] | None = None  # (warning, critical) absolute levels of a drop monitor's series


MONITORS: Mapping[str, MonitorSpec] = {
    "entropy_collapse": MonitorSpec("drop", "entropy", 0.5, 0.8, "ours: relative drop of the policy entropy;"
                                    " absolute floor 0.05 / 0.01 nats per token, ours", ENTROPY_FLOOR),
    "kl_spike": MonitorSpec("spike", "kl_ref", 6.0, 10.0, "ours: k sigma over the trailing window"),
    "clip_fraction": MonitorSpec("level", "clip_frac", 0.2, 0.4, "ours"),
    "grad_norm_spike": MonitorSpec("spike", "grad_norm", 6.0, 10.0, "ours: k sigma over the trailing window"),
    "behaviour_mismatch": MonitorSpec("level", "behaviour_kl", 0.005, 0.02,
                                      "ours: KL(pi_sampler || pi_old) per trained token (k3), as the trainer publishes it"),
    "length_hacking": MonitorSpec("rise_flat", "mean_length", 0.5, 1.0, "ours: relative length rise, flat outcome"),
    "repetition": MonitorSpec("level", "repetition_share", 0.05, 0.2, "repetitive: slime's zlib check (as issue 24 cites it); shares ours"),
    "format_collapse": MonitorSpec("drop", "format_pass_rate", 0.2, 0.5, "ours: relative drop of the pass rate"),
    "component_dominance": MonitorSpec("level_flat", "dominance", 0.6, 0.8, "ours: one shaped component's share"),
    "judge_disagreement": MonitorSpec("level", "judge_disagreement", 0.2, 0.4, "ours"),
    "zero_variance_saturation": MonitorSpec("level", "zero_variance_share", 0.5, 0.8, "ours"),
    "truncation_rate": MonitorSpec("level", "truncation_share", 0.1, 0.3, "ours"),
    "error_rate": MonitorSpec("level", "error_share", 0.05, 0.2, "warning: prime-rl's sustained 5% (as issue 24 cites it); critical ours"),
    "stale_rate": MonitorSpec("level", "stale_share", 0.1, 0.3, "ours"),
}
# trainer metrics (POST /v1/policy) each monitor series is read from; clip_frac = low + high
TRAINER_SERIES: Mapping[str, tuple[str, ...]] = {
    "entropy": ("entropy",),
    "kl_ref": ("kl_ref",),
    "clip_frac": ("clip_frac_low", "clip_frac_high"),
    "grad_norm": ("grad_norm",),
    "behaviour_kl": ("behaviour_kl",),  # k3 estimate of KL(pi_sampler || pi_old) per token (trainer.loss)
}


# The domain of each trainer metric the monitors read: (lowest, highest), both inclusive. A value outside
# it (a negative KL, a clip fraction of -1) would average real trouble away; POST /v1/policy refuses it.
METRIC_DOMAINS: Mapping[str, tuple[float, float]] = {
    "entropy": (0.0, math.inf),
    "kl_ref": (0.0, math.inf),
    "clip_frac_low": (0.0, 1.0),
    "clip_frac_high": (0.0, 1.0),
    "grad_norm": (0.0, math.inf),
    "behaviour_kl": (0.0, math.inf),  # k3 >= 0
}


def metric_problem(key: str, value: object) -> str | None:
    """Why ``value`` cannot be the trainer metric ``key`` the monitors read (None: it can, or the key is
    not one they read)."""
    if key not in METRIC_DOMAINS:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number, got {type(value).__name__}"
    lo, hi = METRIC_DOMAINS[key]
    if not math.isfinite(value):
        return "must be finite"
    if not lo <= value <= hi:
        return f"{value} is outside [{lo}, {hi}]"
    return None


def check_monitor(name: str) -> MonitorSpec:
    if name not in MONITORS:
        raise ValueError(f"monitor {name!r}: expected one of {', '.join(MONITOR_NAMES)}")
    return MONITORS[name]


@dataclass(frozen=True)
class Thresholds:
    warning: float
    critical: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.warning) and math.isfinite(self.critical)):
            raise ValueError("warning, critical: must be finite")
        if self.warning > self.critical:
            raise ValueError(f"warning: {self.warning} is above critical {self.critical}")

    def state(self, value: float | None) -> State:
        if value is None:
            return "ok"
        return "critical" if value >= self.critical else "warning" if value >= self.warning else "ok"


@dataclass(frozen=True)
class MonitorResult:
    value: float | None  # None: not enough data in the window
    state: State
    threshold: float | None  # the threshold the state crossed (None when ok)
    evidence: Mapping[str, object] = field(default_factory=dict)


def _clean(values: Sequence[float | None]) -> np.ndarray:
    """(V,) -> the finite values, in order."""
    arr = np.asarray([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    return arr[np.isfinite(arr)]


def level(values: Sequence[float | None], recent: int = RECENT) -> float | None:
    x = _clean(values)
    return float(x[-recent:].mean()) if len(x) >= recent else None


def recent_median(values: Sequence[float | None], recent: int = RECENT) -> float | None:
    """The median of the last ``recent`` finite values: a drop monitor's "now" (one outlier does not move it)."""
    x = _clean(values)
    return float(np.median(x[-recent:])) if len(x) >= recent else None


def relative_drop(values: Sequence[float | None], baseline: int = BASELINE, recent: int = RECENT) -> float | None:
    """``1 - mean(min(last recent, before)) / before`` with ``before = mean(first baseline)``, at least 0; None
    without a positive baseline. Capped at ``before``: a recent value above the baseline counts as no drop,
    never as more than that, so one large value does not hide a collapse of the others."""
    x = _clean(values)
    if len(x) < baseline + recent:
        return None
    before = float(x[:baseline].mean())
    return None if before <= 0 else max(0.0, 1.0 - float(np.minimum(x[-recent:], before).mean()) / before)


def relative_rise(values: Sequence[float | None], baseline: int = BASELINE, recent: int = RECENT) -> float | None:
    x = _clean(values)
    if len(x) < baseline + recent:
        return None
    before = float(x[:baseline].mean())
    return None if before <= 0 else max(0.0, float(x[-recent:].mean()) / before - 1.0)


def gain(values: Sequence[float | None], baseline: int = BASELINE, recent: int = RECENT) -> float | None:
    """``mean(last recent) - mean(first baseline)`` (absolute)."""
    x = _clean(values)
    if len(x) < baseline + recent:
        return None
    return float(x[-recent:].mean() - x[:baseline].mean())


def floor_severity(level_value: float | None, floor: tuple[float, float], thresholds: Thresholds) -> float | None:
    """An absolute level on a drop monitor's scale (higher is worse), so one value carries both checks.
    With floors ``fw > fc`` and thresholds ``w <= c``: ``w * fw / level`` at or above the warning floor (``w``
    exactly at it, towards 0 far above it), rising linearly from ``w`` to ``c`` between the two floors, ``c``
    at or below the critical floor. Resolving (below ``w * resolve_ratio``) thus needs the level back above
    ``fw / resolve_ratio``: hysteresis as for every other value."""
    if level_value is None:
        return None
    fw, fc = floor
    w, c = thresholds.warning, thresholds.critical
    if level_value <= fc:
        return c
    if level_value < fw:
        return w + (c - w) * (fw - level_value) / (fw - fc)
    return w * fw / level_value


def gain_tolerance(values: Sequence[float | None], baseline: int = BASELINE, recent: int = RECENT) -> float:
    """The outcome gain that counts as real: ``max(OUTCOME_TOLERANCE, OUTCOME_GAIN_SE * se)``, with ``se``
    the standard error of ``gain`` from the spread of the per-version values (sample variances of the first
    ``baseline`` and the last ``recent``). Few trajectories per version make a noisy outcome; without this
    its noise passes for learning and hides length hacking and dominance."""
    x = _clean(values)
    if len(x) < baseline + recent:
        return OUTCOME_TOLERANCE
    se = math.sqrt(float(x[:baseline].var(ddof=1)) / baseline + float(x[-recent:].var(ddof=1)) / recent)
    return max(OUTCOME_TOLERANCE, OUTCOME_GAIN_SE * se)


def _robust(base: np.ndarray) -> tuple[float, float]:
    """(median, scale) of ``base``: the scale ``MAD_NORMAL * MAD``, floored (``SPIKE_STD_FLOOR``)."""
    med = float(np.median(base))
    mad = float(np.median(np.abs(base - med)))
    return med, max(MAD_NORMAL * mad, SPIKE_STD_FLOOR * abs(med), 1e-12)


def spike_z(values: Sequence[float | None], min_trailing: int = SPIKE_MIN_TRAILING, recent: int = 1) -> float | None:
    """The largest upward robust z-score of the last ``recent`` values (each against the values before it,
    less the current spike run: see the module docstring); None with fewer than ``min_trailing`` earlier."""
    x = _clean(values)
    if len(x) < min_trailing + 1:
        return None
    best = 0.0
    for i in range(max(min_trailing, len(x) - max(1, recent)), len(x)):
        med, scale = _robust(x[:i])
        start = i
        while start > min_trailing and (x[start - 1] - med) / scale >= SPIKE_RUN_Z:
            start -= 1
        if start < i:
            med, scale = _robust(x[:start])
        z = (float(x[i]) - med) / scale
        if not math.isnan(z):
            best = max(best, z)
    return best


def _finite(value: float | None) -> float | None:
    """NaN -> None (no value); +-inf (finite inputs whose arithmetic overflowed) -> the largest double."""
    if value is None or math.isnan(value):
        return None
    return value if math.isfinite(value) else math.copysign(sys.float_info.max, value)


def _result(value: float | None, thresholds: Thresholds, evidence: dict[str, object]) -> MonitorResult:
    value = _finite(value)
    state = thresholds.state(value)
    threshold = {"ok": None, "warning": thresholds.warning, "critical": thresholds.critical}[state]
    return MonitorResult(value, state, threshold, evidence)


def evaluate(
    name: str, series: Mapping[str, Sequence[float | None]], thresholds: Thresholds | None = None,
    recent: int = 1,
) -> MonitorResult:
    """One monitor over a window: ``series`` maps a series name to its values, oldest version first
    (``None`` where a version has no value). The evidence holds the series the monitor read. ``recent``:
    how many of the last values are new since the previous evaluation (a spike monitor scores each)."""
    spec = check_monitor(name)
    thresholds = thresholds or Thresholds(spec.warning, spec.critical)
    with np.errstate(over="ignore", invalid="ignore"):  # finite extremes overflow to inf: see _finite
        return _evaluate(spec, series, thresholds, recent)


def _evaluate(spec: MonitorSpec, series: Mapping[str, Sequence[float | None]], thresholds: Thresholds,
              recent: int = 1) -> MonitorResult:
    x = list(series.get(spec.series, ()))
    evidence: dict[str, object] = {spec.series: x}
    if spec.kind == "level":
        value = level(x)
    elif spec.kind == "drop":
        value = relative_drop(x)
        if spec.floor is not None:
            now = recent_median(x)
            evidence[f"{spec.series}_level"] = now  # numbers, not series: the dashboard draws only series
            evidence[f"{spec.series}_floor_warning"], evidence[f"{spec.series}_floor_critical"] = spec.floor
            severity = floor_severity(now, spec.floor, thresholds)
            if severity is not None:
                value = severity if value is None else max(value, severity)
    elif spec.kind == "spike":
        value = spike_z(x, recent=recent)
    else:
        outcome = list(series.get("mean_outcome", ()))
        evidence["mean_outcome"] = outcome
        gained = gain(outcome)
        paid = gained is not None and gained > gain_tolerance(outcome)
        if spec.kind == "rise_flat":
            corr = level(series.get("length_reward_corr", ()))
            evidence["length_reward_corr"] = list(series.get("length_reward_corr", ()))
            value = relative_rise(x)
            evidence["length_rise"] = value  # a number beside the series: what the gates act on
            if value is not None and paid:
                value = 0.0
            elif value is not None and corr is not None and corr < -LENGTH_CORR_TOLERANCE:
                value = None  # held: a weak, noisy sign opens nothing and resolves nothing
        else:
            value = level(x)
            if value is not None and paid:
                value = 0.0
    return _result(value, thresholds, evidence)


# -- per-version inputs --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ComponentFact:
    """One reward component's value for one trajectory; ``weight`` from the spec."""

    name: str
    kind: str
    value: float | None
    weight: float = 1.0
    outcome: bool = False


@dataclass(frozen=True)
class TrajectoryFact:
    tokens: int  # model-generated tokens
    finish_reason: str
    text: str = ""  # the answer (only its last ZLIB_TAIL_CHARS are read)
    outcome: float | None = None
    total: float | None = None
    components: tuple[ComponentFact, ...] = ()


@dataclass(frozen=True)
class GroupFact:
    version: int  # the policy version that sampled it
    trajectories: tuple[TrajectoryFact, ...]
    scored: bool = False
    zero_variance: bool = False  # the curation metric had no spread (all solved / all failed)
    stale: bool = False  # dropped as stale


@dataclass(frozen=True)
class VersionStats:
    version: int
    n_groups: int
    mean_length: float | None
    mean_outcome: float | None
    length_reward_corr: float | None
    repetition_share: float | None
    format_pass_rate: float | None
    dominance: float | None
    judge_disagreement: float | None
    zero_variance_share: float | None
    truncation_share: float | None
    error_share: float | None
    stale_share: float | None


def zlib_ratio(text: str, tail: int = ZLIB_TAIL_CHARS) -> float:
    """len(tail bytes) / len(zlib(tail bytes)) of the text's last ``tail`` characters."""
    data = text[-tail:].encode("utf-8", "replace")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def repeated_ngram_share(text: str, n: int = NGRAM) -> float:
    """The share of the text's word n-grams that repeat an earlier one (0 for fewer than n words)."""
    words = text.split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 0.0 if not grams else 1.0 - len(set(grams)) / len(grams)


def is_repetitive(text: str) -> bool:
    tail = text[-ZLIB_TAIL_CHARS:]
    if len(tail) >= ZLIB_MIN_CHARS and zlib_ratio(tail) > ZLIB_RATIO:
        return True
    return len(tail.split()) >= NGRAM_MIN_WORDS and repeated_ngram_share(tail) > NGRAM_REPEAT_SHARE


def group_corr(lengths: np.ndarray, rewards: np.ndarray, groups: np.ndarray) -> float | None:
    """Mean within-group Pearson correlation of length and reward. lengths, rewards, groups (N,) -> float;
    groups where either has no spread (or of one member) are left out; None when none is left."""
    keys, inv = np.unique(groups, return_inverse=True)
    count = np.bincount(inv, minlength=len(keys)).astype(np.float64)
    mx = np.bincount(inv, lengths, len(keys)) / count
    my = np.bincount(inv, rewards, len(keys)) / count
    dx, dy = lengths - mx[inv], rewards - my[inv]
    sxy = np.bincount(inv, dx * dy, len(keys))
    sxx, syy = np.bincount(inv, dx * dx, len(keys)), np.bincount(inv, dy * dy, len(keys))
    ok = (sxx > 1e-12) & (syy > 1e-12)
    return float((sxy[ok] / np.sqrt(sxx[ok] * syy[ok])).mean()) if ok.any() else None


def _share(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _dominance(trajs: Sequence[TrajectoryFact]) -> float | None:
    """max over shaped components of mean|w*v| / sum over all components of mean|w*v|."""
    sums: dict[tuple[str, bool], float] = {}
    for t in trajs:
        for c in t.components:
            if c.value is not None:
                sums[(c.name, c.outcome)] = sums.get((c.name, c.outcome), 0.0) + abs(c.weight * c.value)
    total = sum(sums.values())
    shaped = [v for (_, outcome), v in sums.items() if not outcome]
    return max(shaped) / total if shaped and total > 0 else None


def _judge_disagreement(trajs: Sequence[TrajectoryFact]) -> float | None:
    flags = []
    for t in trajs:
        ver = [c.value for c in t.components if c.kind.startswith("verifier.") and c.value is not None]
        jud = [c.value for c in t.components if c.kind.startswith("judge.") and c.value is not None]
        if ver and jud:
            flags.append((ver[0] >= 0.5) != (jud[0] >= 0.5))
    return _share(flags)


def _version_stats(version: int, groups: Sequence[GroupFact]) -> VersionStats:
    trajs = [t for g in groups for t in g.trajectories]
    scored = [g for g in groups if g.scored]
    scored_trajs = [t for g in scored for t in g.trajectories]
    lengths, rewards, keys = [], [], []
    for k, g in enumerate(scored):
        for t in g.trajectories:
            if t.total is not None:
                lengths.append(float(t.tokens))
                rewards.append(t.total)
                keys.append(k)
    corr = group_corr(np.asarray(lengths), np.asarray(rewards), np.asarray(keys)) if keys else None
    fmt = [c.value > 0 for t in scored_trajs for c in t.components if c.kind == "rule.format" and c.value is not None]
    return VersionStats(
        version=version,
        n_groups=len(groups),
        mean_length=_mean([float(t.tokens) for t in trajs]),
        mean_outcome=_mean([t.outcome for t in scored_trajs if t.outcome is not None]),
        length_reward_corr=corr,
        repetition_share=_share([is_repetitive(t.text) for t in trajs]),
        format_pass_rate=_share(fmt),
        dominance=_dominance(scored_trajs),
        judge_disagreement=_judge_disagreement(scored_trajs),
        zero_variance_share=_share([g.zero_variance for g in scored]),
        truncation_share=_share([t.finish_reason in BUDGET_REASONS for t in trajs]),
        error_share=_share([t.finish_reason in ENVIRONMENT_REASONS for t in trajs]),
        stale_share=_share([g.stale for g in groups]),
    )


def _by_version(groups: Sequence[GroupFact]) -> dict[int, tuple[GroupFact, ...]]:
    by_version: dict[int, list[GroupFact]] = {}
    for g in groups:
        by_version.setdefault(g.version, []).append(g)
    return {v: tuple(by_version[v]) for v in sorted(by_version)}


def summarize(groups: Sequence[GroupFact], cache: StatsCache | None = None) -> dict[int, VersionStats]:
    """Groups -> one VersionStats per sampler version present, ascending by version. With a ``cache``, a
    version whose groups are exactly those of the cache's previous call is not computed again."""
    if cache is not None:
        return cache.summarize(groups)
    return {v: _version_stats(v, gs) for v, gs in _by_version(groups).items()}


class StatsCache:
    """``summarize`` made incremental over a sliding window: each version's stats are kept from one call to
    the next, keyed by the version and its exact groups (``GroupFact`` is frozen, compared field by field:
    texts, scores, flags), so a version is computed again only when its facts changed (a new version, a
    group added or scored since) and the result always equals ``summarize(groups)``. Holds the previous
    call's facts only (one window); a version that left the window is dropped."""

    def __init__(self) -> None:
        self._previous: dict[int, tuple[tuple[GroupFact, ...], VersionStats]] = {}

    def summarize(self, groups: Sequence[GroupFact]) -> dict[int, VersionStats]:
        previous: dict[int, tuple[tuple[GroupFact, ...], VersionStats]] = self._previous
        kept: dict[int, tuple[tuple[GroupFact, ...], VersionStats]] = {}
        out: dict[int, VersionStats] = {}
        for v, gs in _by_version(groups).items():
            hit = previous.get(v)
            # equal facts (tuple equality: the same objects at once, else field by field), no hashing
            stats = hit[1] if hit is not None and hit[0] == gs else _version_stats(v, gs)
            kept[v], out[v] = (gs, stats), stats
        self._previous = kept  # one assignment: a concurrent call sees the old or the new window, both right
        return out


def trainer_value(metrics: Mapping[str, object], series: str) -> float | None:
    """A trainer series from one published version's metrics; None when a key is missing or not finite."""
    total = 0.0
    for key in TRAINER_SERIES[series]:
        value = metrics.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return None
        total += float(value)
    return total if math.isfinite(total) else None  # two finite extremes can overflow


def window_series(
    versions: Sequence[int], stats: Mapping[int, VersionStats], metrics: Mapping[int, Mapping[str, object]]
) -> dict[str, list[float | None]]:
    """Every monitor series over ``versions`` (ascending): VersionStats fields and trainer metrics."""
    out: dict[str, list[float | None]] = {}
    for name in VersionStats.__dataclass_fields__:
        if name not in ("version", "n_groups"):
            out[name] = [getattr(stats[v], name) if v in stats else None for v in versions]
    for name in TRAINER_SERIES:
        out[name] = [trainer_value(metrics[v], name) if v in metrics else None for v in versions]
    return out
