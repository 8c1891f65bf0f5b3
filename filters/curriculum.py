"""Refill and curriculum: which prompts are worth sampling again.

A prompt's running difficulty is its pass rate: the mean outcome over its recent groups (each group
contributes `GroupDecision.outcome_mean`). Prompts whose last k groups were all solved or all failed
give zero-variance groups -- no GRPO signal (DAPO, Yu et al. 2025, dynamic sampling) -- so refill
deprioritises them instead of spending rollouts on them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from filters.types import CurriculumConfig


def _check_finite(values: Sequence[float]) -> None:
    """ValueError on a NaN / infinite outcome mean."""
    for v in values:
        if not math.isfinite(v):
            raise ValueError(f"outcome means must be finite, got {v}")


def pass_rate(recent_outcome_means: Sequence[float], *, window: int | None = None) -> float | None:
    """Running difficulty: mean of the last `window` group outcome means (all when None).

    recent_outcome_means is oldest first. None when there is no group yet.
    """
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 or None, got {window}")
    _check_finite(recent_outcome_means)
    values = list(recent_outcome_means)[-window:] if window is not None else list(recent_outcome_means)
    if not values:
        return None
    return math.fsum(values) / len(values)


def prompt_priority(
    recent_outcome_means: Sequence[float],
    *,
    k: int = 3,
    solved: float = 1.0,
    failed: float = 0.0,
    low_priority: float = 0.1,
) -> float:
    """Sampling priority of a prompt from its group outcome means (oldest first).

    1.0 normally; `low_priority` when there are at least k groups and the last k were all solved
    (mean >= solved) or all failed (mean <= failed). Mixed histories stay at 1.0.
    """
    CurriculumConfig(k=k, solved=solved, failed=failed, low_priority=low_priority)
    _check_finite(recent_outcome_means)
    if len(recent_outcome_means) < k:
        return 1.0
    last = list(recent_outcome_means)[-k:]
    if all(v >= solved for v in last) or all(v <= failed for v in last):
        return low_priority
    return 1.0


def priority_for(recent_outcome_means: Sequence[float], cfg: CurriculumConfig) -> float:
    """`prompt_priority` with the settings of a policy's `CurriculumConfig`."""
    return prompt_priority(
        recent_outcome_means, k=cfg.k, solved=cfg.solved, failed=cfg.failed, low_priority=cfg.low_priority
    )
