"""Mergeable histograms for the quantiles of ``GET /v1/stats`` (sparse {bucket: count} maps that add).

Small multiples of 1/8 (token counts, the usual reward levels) get exact buckets; other values fall in
log buckets of relative width ALPHA (DDSketch, Masson et al. 2019), so a quantile is exact where the
values are exact and within ALPHA of the exact one elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

ALPHA = 0.02  # relative accuracy of the quantiles
_GAMMA = (1 + ALPHA) ** 2  # bucket i holds [gamma^(i - 1/2), gamma^(i + 1/2)), represented by gamma^i
_LOG_GAMMA = math.log(_GAMMA)
_ZERO = 1e-9  # |v| below this falls in the zero bucket
QUANTILES = (0.1, 0.5, 0.9)
_EXACT_STEPS = 8  # k / 8 with |k / 8| <= _EXACT_MAX has an exact bucket (token counts, 0 / 0.5 / 1)
_EXACT_MAX = 64.0


@lru_cache(maxsize=1 << 16)
def bucket_of(value: float) -> str:
    """Bucket of a value: 'x<k>' for an exact multiple k / 8 of 1/8 with |v| <= 64 (small integers and the
    usual reward levels keep their exact value), 'z' for |v| < 1e-9, else the log bucket (DDSketch-style,
    centred) 'p<i>' / 'n<i>' (sign) with i = round(log_gamma |v|), whose value is within ALPHA of every member."""
    magnitude = abs(value)
    if magnitude < _ZERO:
        return "z"
    scaled = value * _EXACT_STEPS
    if magnitude <= _EXACT_MAX and scaled == math.floor(scaled):
        return f"x{int(scaled)}"
    return f"{'p' if value > 0 else 'n'}{round(math.log(magnitude) / _LOG_GAMMA)}"


@lru_cache(maxsize=1 << 16)
def bucket_value(bucket: str) -> float:
    """The representative of a bucket: exact for 'z' and 'x<k>', gamma^i (relative error <= ALPHA for every
    member) for a log bucket."""
    if bucket == "z":
        return 0.0
    if bucket[0] == "x":
        return int(bucket[1:]) / _EXACT_STEPS
    value = _GAMMA ** int(bucket[1:])
    return value if bucket[0] == "p" else -value


def _value_at_rank(items: Sequence[tuple[float, float]], rank: int) -> float:
    """The value of 0-based ``rank`` in the sorted multiset given as sorted (value, count) pairs."""
    seen = 0.0
    for value, count in items:
        seen += count
        if seen > rank:
            return value
    return items[-1][0]


def quantiles(hist: Mapping[str, float], qs: Sequence[float] = QUANTILES) -> list[float | None]:
    """Quantiles of a bucket histogram {bucket: count} by linear interpolation between the two closest
    ranks (numpy's default ``method="linear"``: position q (n - 1)); exact where the values have exact
    buckets, else within ALPHA of the exact one. None for an empty histogram."""
    items = sorted((bucket_value(b), c) for b, c in hist.items() if c > 0)
    n = sum(c for _, c in items)
    if n <= 0:
        return [None for _ in qs]
    out: list[float | None] = []
    for q in qs:
        position = q * (n - 1)
        low = math.floor(position + 1e-9)
        frac = max(0.0, position - low)
        below = _value_at_rank(items, low)
        above = _value_at_rank(items, low + 1) if frac > 1e-12 else below
        out.append(below + frac * (above - below))
    return out
