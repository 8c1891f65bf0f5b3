"""Group-relative advantage estimators, per group (G,) and batched over padded groups (B, G).

- grpo: A_i = (r_i - mean(r)) / (std(r) + eps)      Shao et al. 2024, DeepSeekMath (GRPO), eq. in §4.1.2
- dr_grpo: A_i = r_i - mean(r)                         Liu et al. 2025, Understanding R1-Zero-Like Training
- rloo: A_i = r_i - mean_{j != i}(r_j)                 Ahmadian et al. 2024, Back to Basics (RLOO)
        = G / (G - 1) * (r_i - mean(r))

Conventions: a group of one gets advantage 0 from every estimator (grpo / dr_grpo: r - mean = 0;
rloo has no leave-one-out baseline). With `std="unbiased"` (ddof 1) a group of one also gets 0.
grpo treats a spread at float rounding level (std <= 1e-12 * max|r|) as none and gives 0, so an
all-equal group gives 0 (not NaN, not +-1 from dividing rounding noise) even with eps = 0.
NaN rewards raise ValueError.

`baseline_only` marks members that enter the baseline statistics (mean, std, leave-one-out means)
but receive advantage 0: masked (truncated) trajectories, see `filters.curate`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from filters.types import STD_KINDS, AdvantageConfig, StdKind, check_choice

ROUNDING_SPREAD = 1e-12  # std <= this * max|r| is float rounding, not spread

GroupEstimator = Callable[[np.ndarray, AdvantageConfig], np.ndarray]
BatchedEstimator = Callable[[np.ndarray, np.ndarray, AdvantageConfig], np.ndarray]


def _as_rewards(rewards: np.ndarray) -> np.ndarray:
    """rewards (G,) as float64; raises ValueError on NaN or a non-1-D input."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"rewards must be 1-D (G,), got shape {r.shape}")
    if np.isnan(r).any():
        raise ValueError("rewards contain NaN; an unscorable reward must be None and dropped")
    return r


def grpo_advantages(rewards: np.ndarray, *, std: StdKind = "population", eps: float = 1e-6) -> np.ndarray:
    """GRPO outcome-supervision advantages (Shao et al. 2024): rewards (G,) -> (G,).

    (r - mean) / (std + eps), std population (ddof 0, default) or unbiased (ddof 1).
    """
    check_choice(std, STD_KINDS, "std kind")
    r = _as_rewards(rewards)
    ddof = 0 if std == "population" else 1
    if r.size <= ddof:
        return np.zeros_like(r)
    std_r = r.std(ddof=ddof)
    if std_r <= ROUNDING_SPREAD * np.abs(r).max():
        return np.zeros_like(r)
    return (r - r.mean()) / (std_r + eps)


def dr_grpo_advantages(rewards: np.ndarray) -> np.ndarray:
    """Dr. GRPO advantages (Liu et al. 2025): rewards (G,) -> (G,), r - mean (no std division)."""
    r = _as_rewards(rewards)
    if r.size == 0:
        return r
    return r - r.mean()


def rloo_advantages(rewards: np.ndarray) -> np.ndarray:
    """RLOO advantages (Ahmadian et al. 2024): rewards (G,) -> (G,), r_i - mean of the others.

    Groups of fewer than 2 get 0.
    """
    r = _as_rewards(rewards)
    g = r.size
    if g < 2:
        return np.zeros_like(r)
    return r - (r.sum() - r) / (g - 1)


ESTIMATORS: dict[str, GroupEstimator] = {
    "grpo": lambda r, cfg: grpo_advantages(r, std=cfg.std, eps=cfg.eps),
    "dr_grpo": lambda r, cfg: dr_grpo_advantages(r),
    "rloo": lambda r, cfg: rloo_advantages(r),
}


def compute_advantages(
    rewards: np.ndarray, cfg: AdvantageConfig, baseline_mask: np.ndarray | None = None
) -> np.ndarray:
    """Advantages for one group: rewards (G,) -> (G,) with the estimator named in `cfg`.

    baseline_mask (G,) bool, optional: True for members that enter the baseline statistics but get
    advantage 0 (masked trajectories).
    """
    check_choice(cfg.estimator, ESTIMATORS, "advantage estimator")
    adv = ESTIMATORS[cfg.estimator](rewards, cfg)
    if baseline_mask is not None:
        adv = np.where(np.asarray(baseline_mask, dtype=bool), 0.0, adv)
    return adv


def _masked_mean(r: np.ndarray, valid: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Row means over valid entries: r (B, G), valid (B, G), n (B,) -> (B, 1); 0 for empty rows."""
    total = np.where(valid, r, 0.0).sum(axis=1)
    return (total / np.maximum(n, 1))[:, None]


def _batched_grpo(r: np.ndarray, valid: np.ndarray, cfg: AdvantageConfig) -> np.ndarray:
    """Masked GRPO over rows: (B, G) -> (B, G)."""
    n = valid.sum(axis=1)
    ddof = 0 if cfg.std == "population" else 1
    centred = np.where(valid, r - _masked_mean(r, valid, n), 0.0)
    std = np.sqrt((centred**2).sum(axis=1) / np.maximum(n - ddof, 1))
    spread = std > ROUNDING_SPREAD * np.where(valid, np.abs(r), 0.0).max(axis=1, initial=0.0)
    ok = (n > ddof) & spread
    return np.where(ok[:, None], centred / np.where(ok, std + cfg.eps, 1.0)[:, None], 0.0)


def _batched_dr_grpo(r: np.ndarray, valid: np.ndarray, cfg: AdvantageConfig) -> np.ndarray:
    """Masked Dr. GRPO over rows: (B, G) -> (B, G)."""
    n = valid.sum(axis=1)
    return np.where(valid, r - _masked_mean(r, valid, n), 0.0)


def _batched_rloo(r: np.ndarray, valid: np.ndarray, cfg: AdvantageConfig) -> np.ndarray:
    """Masked RLOO over rows: (B, G) -> (B, G); rows with fewer than 2 valid members get 0."""
    n = valid.sum(axis=1)
    total = np.where(valid, r, 0.0).sum(axis=1, keepdims=True)
    others = (total - r) / np.maximum(n - 1, 1)[:, None]
    return np.where(valid & (n >= 2)[:, None], r - others, 0.0)


BATCHED_ESTIMATORS: dict[str, BatchedEstimator] = {
    "grpo": _batched_grpo,
    "dr_grpo": _batched_dr_grpo,
    "rloo": _batched_rloo,
}


def batched_advantages(
    rewards: np.ndarray,
    valid: np.ndarray,
    cfg: AdvantageConfig,
    baseline_mask: np.ndarray | None = None,
) -> np.ndarray:
    """Advantages for B padded groups at once: rewards (B, G), valid (B, G) bool -> (B, G).

    Row b is the group rewards[b, valid[b]]; padding (valid False) is ignored and gets 0, so the
    result equals `compute_advantages` applied row by row. baseline_mask (B, G) bool: members in the
    baseline statistics that get advantage 0. NaN in a valid entry raises ValueError.
    """
    check_choice(cfg.estimator, BATCHED_ESTIMATORS, "advantage estimator")
    r = np.asarray(rewards, dtype=np.float64)
    v = np.asarray(valid, dtype=bool)
    if r.ndim != 2 or r.shape != v.shape:
        raise ValueError(f"rewards and valid must both be (B, G), got {r.shape} and {v.shape}")
    if np.isnan(r[v]).any():
        raise ValueError("rewards contain NaN; an unscorable reward must be None and dropped")
    r = np.where(v, r, 0.0)
    adv = BATCHED_ESTIMATORS[cfg.estimator](r, v, cfg)
    if baseline_mask is not None:
        adv = np.where(np.asarray(baseline_mask, dtype=bool), 0.0, adv)
    return adv
