"""Quantiles of values that share one histogram bucket are their exact mean: a lone total of 0.1 reports
p10 = p50 = p90 = 0.1, not the log bucket's representative (0.101 before)."""

from __future__ import annotations

import pytest

from service.stats.service import add_trajectory, summarize


def _counters(totals: list[float]) -> dict[str, float]:
    c: dict[str, float] = {}
    for i, total in enumerate(totals):
        add_trajectory(c, 1.0, (1, i, "toy", 0, 0, "stop", 10, total, None, "keep", None, None, None), False)
    return c


@pytest.mark.parametrize("value", [0.1, 0.7, 3.3, -0.37, 1234.5])
def test_a_single_value_is_its_own_quantiles(value):
    for totals in ([value], [value] * 5):
        total = summarize(_counters(totals))["total"]
        assert (total["p10"], total["p50"], total["p90"]) == (pytest.approx(value, rel=1e-12),) * 3


def test_values_in_several_buckets_still_interpolate():
    total = summarize(_counters([0.1, 0.9]))["total"]
    assert total["p10"] < total["p50"] < total["p90"]
    assert total["p50"] == pytest.approx(0.5, rel=0.05)
