"""DAPO soft overlong penalty: the three regions, the buffer forms, scalar == vectorised."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filters.overlong import overlong_buffer_tokens, soft_overlong_penalties, soft_overlong_penalty


@pytest.mark.parametrize(
    ("num_tokens", "expected"),
    [(0, 0.0), (800, 0.0), (801, -0.005), (900, -0.5), (1000, -1.0), (1001, -1.0), (5000, -1.0)],
)
def test_regions(num_tokens: int, expected: float) -> None:
    # L_max = 1000, L_cache = 200: no penalty up to 800, linear to -1 at 1000, -1 beyond
    assert soft_overlong_penalty(num_tokens, 1000, 200) == pytest.approx(expected)


def test_zero_buffer_is_a_hard_cutoff() -> None:
    assert soft_overlong_penalty(1000, 1000, 0) == 0.0
    assert soft_overlong_penalty(1001, 1000, 0) == -1.0


def test_buffer_larger_than_budget_is_clamped() -> None:
    assert soft_overlong_penalty(500, 1000, 5000) == pytest.approx(-0.5)


def test_buffer_fraction_or_tokens() -> None:
    assert overlong_buffer_tokens(0.2, 1024) == 204
    assert overlong_buffer_tokens(256, 1024) == 256
    assert overlong_buffer_tokens(4096, 1024) == 1024
    assert overlong_buffer_tokens(0.0, 1024) == 0
    # a positive fraction of a tiny budget is still one token, so a response cut at the budget is penalised
    assert overlong_buffer_tokens(0.2, 3) == 1
    assert soft_overlong_penalty(3, 3, overlong_buffer_tokens(0.2, 3)) == -1.0
    with pytest.raises(ValueError):
        overlong_buffer_tokens(-0.1, 1024)


def test_max_tokens_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        soft_overlong_penalty(10, 0, 0)
    with pytest.raises(ValueError, match="max_tokens"):
        soft_overlong_penalties(np.array([10]), np.array([0]), np.array([0]))


@settings(max_examples=200, deadline=None)
@given(
    cases=st.lists(
        st.tuples(st.integers(0, 3000), st.integers(1, 2000), st.integers(0, 2500)), min_size=1, max_size=20
    )
)
def test_vectorised_matches_scalar(cases: list[tuple[int, int, int]]) -> None:
    n, m, b = (np.array(c) for c in zip(*cases, strict=True))
    got = soft_overlong_penalties(n, m, b)
    expected = [soft_overlong_penalty(*c) for c in cases]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert ((got <= 0) & (got >= -1)).all()
