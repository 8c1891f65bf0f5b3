"""Refill priority and running pass rate."""

from __future__ import annotations

import pytest

from filters.curriculum import pass_rate, priority_for, prompt_priority
from filters.types import CurriculumConfig


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        ([], 1.0),
        ([1.0, 1.0], 1.0),  # fewer than k groups: not enough evidence
        ([1.0, 1.0, 1.0], 0.1),
        ([0.0, 0.0, 0.0], 0.1),
        ([0.5, 1.0, 1.0, 1.0], 0.1),  # only the last k count
        ([1.0, 1.0, 0.875], 1.0),
        ([1.0, 0.0, 1.0], 1.0),  # solved and failed mixed: still informative at the prompt level
        ([0.0, 0.0, 0.0, 0.25], 1.0),
    ],
)
def test_prompt_priority(history: list[float], expected: float) -> None:
    assert prompt_priority(history) == expected


def test_thresholds_are_configurable() -> None:
    assert prompt_priority([0.9, 0.95], k=2, solved=0.9, low_priority=0.0) == 0.0
    assert prompt_priority([0.1, 0.05], k=2, failed=0.1) == 0.1
    cfg = CurriculumConfig(k=2, solved=0.8, failed=0.2, low_priority=0.3)
    assert priority_for([0.85, 0.9], cfg) == 0.3
    assert priority_for([0.5, 0.9], cfg) == 1.0


def test_invalid_settings_raise() -> None:
    with pytest.raises(ValueError, match="k"):
        prompt_priority([1.0], k=0)
    with pytest.raises(ValueError, match="finite"):
        prompt_priority([float("nan")] * 3)


def test_pass_rate() -> None:
    assert pass_rate([]) is None
    assert pass_rate([0.0, 0.5, 1.0]) == pytest.approx(0.5)
    assert pass_rate([0.0, 0.5, 1.0], window=2) == pytest.approx(0.75)
    assert pass_rate([0.25], window=10) == 0.25
    with pytest.raises(ValueError, match="window"):
        pass_rate([1.0], window=0)
