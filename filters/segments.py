"""Segmented trajectories: one trajectory's advantage assigned to its K ordered segments.

A trajectory may be stored as K ordered segments (summary checkpoints, a gateway's prefix mismatch), each
its own sequence for the trainer. Advantages are computed group-relative from the trajectories' final
rewards, exactly as for unsegmented members; this module then gives segment k (0-based, k = K-1 the last)
its share by the policy's `segment_advantage`:

- `broadcast` (default; SkyRL step-wise, agent-lightning, ReSum-GRPO): every segment gets A.
- `divide` (slime): every segment gets A / K, K the segments the trainer trains on (those with a mask-1
  target; a segment with none gets the same share and is never trained), so a trajectory's divided
  segments sum to A over what is trained.
- `discount` (AReaL's summarizing agents): segment k gets A * gamma^(K-1-k), gamma = `segment_discount`
  in (0, 1]; the last segment gets A, each earlier one gamma times the next.

The trainer counts every trajectory once in the loss's denominator (each of K segments a share 1/K) and
divides by K exactly once in the numerator (docs/training.md, "Segmented trajectories"; `segment_weight`):
segments that each *carry* A (`broadcast`, `discount`) are averaged -- weight 1/K each, the per-rollout
mean -- while segments that *share* A (`divide`: their advantages sum to A, the division by K is already
in them) are weighed 1. So a K-segment trajectory's weight in the loss does not grow with K, and `divide`
trains exactly as `broadcast` (it differs only for a consumer that treats segments as separate samples). The mode comes with the leased batch (each segmented trajectory's
``segment_advantage``, its group's curation policy's): it cannot be read off the advantages, since
`discount`'s trained ones can sum to A too (gamma = (sqrt 5 - 1) / 2 and an untrained last segment:
A gamma^2 + A gamma = A). `guess_segment_advantage` guesses it only for a batch without it (from a service
that did not send it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal, get_args

SegmentAdvantage = Literal["broadcast", "divide", "discount"]
SEGMENT_ADVANTAGES: tuple[str, ...] = get_args(SegmentAdvantage)
DEFAULT_SEGMENT_DISCOUNT = 0.9


def check_segment_mode(mode: str) -> None:
    """ValueError naming the valid choices."""
    if mode not in SEGMENT_ADVANTAGES:
        raise ValueError(f"segment_advantage must be one of {', '.join(SEGMENT_ADVANTAGES)}, got {mode!r}")


def check_segment_policy(mode: str, gamma: float) -> None:
    """ValueError naming the valid choices / range."""
    check_segment_mode(mode)
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"segment_discount must be in (0, 1], got {gamma}")


def segment_advantages(advantage: float, k: int, mode: str = "broadcast",
                       gamma: float = DEFAULT_SEGMENT_DISCOUNT, trained: int | None = None) -> tuple[float, ...]:
    """The advantages of a trajectory's k segments, first to last; () when it has none (k = 0). ``trained``:
    how many of them the trainer trains on (None: all k), the divisor of ``divide``."""
    check_segment_policy(mode, gamma)
    if k < 0:
        raise ValueError(f"a trajectory has k >= 0 segments, got {k}")
    if trained is not None and not 0 <= trained <= k:
        raise ValueError(f"a trajectory trains 0 to {k} of its segments, got {trained}")
    if mode == "broadcast":
        return (float(advantage),) * k
    if mode == "divide":
        return (float(advantage) / (trained or k),) * k if k else ()
    return tuple(float(advantage) * gamma ** (k - 1 - i) for i in range(k))


def with_segment_advantages(decisions: Sequence[Any], scores: Sequence[Any], mode: str, gamma: float) -> tuple[Any, ...]:
    """`filters.types.TrajectoryDecision`s (typed Any here: `filters.types` imports this module) of one
    group and their `TrajectoryScore`s -> the decisions with each segmented member's `segment_advantages` set from its advantage (the
    one assignment both curation paths, `curate_group` and the vectorised one, apply)."""
    out = []
    for d, t in zip(decisions, scores, strict=True):
        if t.segments:
            d = replace(d, segment_advantages=segment_advantages(d.advantage, t.segments, mode, gamma,
                                                                 getattr(t, "trained_segments", None)))
        out.append(d)
    return tuple(out)


def segment_weight(mode: str, trained: int) -> float:
    """The trainer's numerator weight of each of a trajectory's K = ``trained`` trained segments under its
    policy's ``segment_advantage`` (the denominator share is 1/K for every mode): 1 for ``divide`` (each
    segment already has A / K: divided once), 1/K for
    ``broadcast`` and ``discount`` (each segment carries A, times gamma^(K-1-k): the per-rollout mean).
    (mode, K) -> weight; K = 1 gives 1."""
    check_segment_mode(mode)
    if trained < 1:
        raise ValueError(f"a segmented trajectory the trainer trains has at least one trained segment, got {trained}")
    return 1.0 if mode == "divide" else 1.0 / trained


def guess_segment_advantage(advantage: float, trained: Sequence[float]) -> SegmentAdvantage:
    """Fallback only, for a leased batch that does not say a trajectory's ``segment_advantage`` (a service
    from before it was sent): ``divide`` when the trained segments' advantages sum to the trajectory's A,
    else ``broadcast`` (which `segment_weight` weighs like ``discount``). Wrong for a ``discount``
    trajectory whose trained advantages happen to sum to A (gamma = (sqrt 5 - 1) / 2 and an untrained last
    segment: A gamma^2 + A gamma = A): it is then weighed 1 instead of 1/K. A = 0 trains no policy gradient
    and cannot be told apart: ``broadcast``. (advantage, (K,)) -> mode."""
    if not trained:
        raise ValueError("a segmented trajectory the trainer trains has at least one trained segment")
    shared = advantage != 0.0 and math.isclose(math.fsum(trained), advantage, rel_tol=1e-6)  # float32 shares: ~1e-7
    return "divide" if shared else "broadcast"
