"""DAPO soft overlong punishment (Yu et al. 2025, DAPO, §3.4 "Overlong Reward Shaping").

With L_max = max_tokens (the sampling budget) and L_cache = buffer (tokens):

    R_length(y) = 0                                  if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
                = -1                                 if |y| > L_max

The penalty is added to the trajectory's reward. A buffer of 0 is a hard cut-off (0 up to L_max,
-1 past it); a buffer larger than L_max is clamped to L_max.
"""

from __future__ import annotations

import math

import numpy as np


def overlong_buffer_tokens(buffer: float, max_tokens: int) -> int:
    """The buffer L_cache in tokens: a fraction in [0, 1) of max_tokens, or a whole token count >= 1.

    A positive fraction is at least one token: with a small budget (0.2 x 3 tokens) rounding down to 0 would
    make the penalty 0 for a response cut exactly at the budget -- truncation would go unpunished.
    """
    if buffer < 0:
        raise ValueError(f"overlong buffer must be >= 0, got {buffer}")
    tokens = (max(1, math.floor(buffer * max_tokens)) if buffer > 0 else 0) if buffer < 1 else int(buffer)
    return min(tokens, max_tokens)


def soft_overlong_penalty(num_tokens: int, max_tokens: int, buffer: int) -> float:
    """DAPO soft overlong penalty in [-1, 0] for one response of `num_tokens` (buffer in tokens)."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
    buffer = min(max(buffer, 0), max_tokens)
    expected = max_tokens - buffer
    if num_tokens <= expected:
        return 0.0
    if num_tokens > max_tokens:
        return -1.0
    return (expected - num_tokens) / buffer


def soft_overlong_penalties(num_tokens: np.ndarray, max_tokens: np.ndarray, buffer: np.ndarray) -> np.ndarray:
    """Vectorised `soft_overlong_penalty`: num_tokens, max_tokens, buffer (N,) ints -> (N,) floats.

    Every max_tokens must be > 0.
    """
    n = np.asarray(num_tokens, dtype=np.float64)
    m = np.asarray(max_tokens, dtype=np.float64)
    if (m <= 0).any():
        raise ValueError("max_tokens must be > 0")
    b = np.clip(np.asarray(buffer, dtype=np.float64), 0.0, m)
    expected = m - b
    ramp = (expected - n) / np.where(b > 0, b, 1.0)
    inside = np.where(n > m, -1.0, ramp)
    return np.where(n <= expected, 0.0, inside)
