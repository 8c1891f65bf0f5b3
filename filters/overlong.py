"""DAPO soft overlong punishment (Yu et al. 2025, DAPO, §3.4 "Overlong Reward Shaping", eq. 13).

With L_max = max_tokens (the sampling budget) and L_cache = buffer (tokens):

    R_length(y) = 0                                  if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
                = -1                                 if |y| > L_max

DAPO adds R_length to the reward of *every* response by its length, cut or not: an answer that stops
inside the buffer zone is shaped too. A response cut by the budget has |y| == L_max and so always gets
exactly -1 from the ramp.

This module is the one implementation of the rule. `soft_overlong_penalties` is the vectorised form; the
scalar `soft_overlong_penalty` (the reference curation path and the `rule.overlong` reward
component) calls it on one element, and the vectorised curation path calls it on whole batches.
A buffer of 0 is a hard cut-off: 0 below L_max, -1 from L_max on. Read literally, eq. 13 with L_cache = 0
gives 0 at |y| == L_max, but a sampler capped at L_max never returns more, so that reading would never
punish a cut response; at the budget a response always gets -1, whatever the buffer (the ramp's end).
A buffer larger than L_max is clamped.
"""

from __future__ import annotations

import numpy as np


def buffer_tokens(buffer: float, max_tokens: np.ndarray) -> np.ndarray:
    """The buffer L_cache in tokens for each budget: max_tokens (N,) ints > 0 -> (N,) ints.

    `buffer` is a fraction in [0, 1) of max_tokens or a whole token count >= 1. A positive fraction is
    at least one token: rounding 0.2 x 3 tokens down to 0 would turn the ramp into a hard cut-off at
    the budget, and a response cut exactly at the budget would go unpunished.
    """
    if not buffer >= 0:
        raise ValueError(f"overlong buffer must be >= 0, got {buffer}")
    m = np.asarray(max_tokens, dtype=np.int64)
    if buffer >= 1:
        tokens = np.full(m.shape, int(buffer), dtype=np.int64)
    elif buffer > 0:
        tokens = np.maximum(1, np.floor(buffer * m).astype(np.int64))
    else:
        tokens = np.zeros(m.shape, dtype=np.int64)
    return np.minimum(tokens, m)


def soft_overlong_penalties(num_tokens: np.ndarray, max_tokens: np.ndarray, buffer: np.ndarray) -> np.ndarray:
    """DAPO soft overlong penalty in [-1, 0]: num_tokens, max_tokens, buffer (N,) ints -> (N,) floats.

    buffer is in tokens (see `buffer_tokens`); every max_tokens must be > 0.
    """
    n = np.asarray(num_tokens, dtype=np.float64)
    m = np.asarray(max_tokens, dtype=np.float64)
    if (m <= 0).any():
        raise ValueError("max_tokens must be > 0")
    b = np.clip(np.asarray(buffer, dtype=np.float64), 0.0, m)
    expected = m - b
    ramp = (expected - n) / np.where(b > 0, b, 1.0)
    inside = np.where(n >= m, -1.0, ramp)  # at the budget: -1 (a buffer of 0 has no ramp to end there)
    return np.where((n <= expected) & (n < m), 0.0, inside)


def soft_overlong_penalty(num_tokens: int, max_tokens: int, buffer: int) -> float:
    """`soft_overlong_penalties` for one response of `num_tokens` (buffer in tokens)."""
    return float(soft_overlong_penalties(np.array([num_tokens]), np.array([max_tokens]), np.array([buffer]))[0])


def overlong_buffer_tokens(buffer: float, max_tokens: int) -> int:
    """`buffer_tokens` for one budget."""
    return int(buffer_tokens(buffer, np.array([max_tokens]))[0])
