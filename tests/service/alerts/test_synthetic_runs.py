"""Synthetic runs through the real API (published trainer metrics, stored groups scored by the real
worker): each pathology raises its own alert at the version computed by hand below, and no other.

Every run: versions 1-20 healthy (mixed groups of 4 at 60 tokens, random 1.2k-character texts with the
format marker, noisy healthy trainer metrics), then the pathology from version 21 on, evaluated after
each version (a long noisy healthy run: test_synthetic_long_run.py). Hand computation (RECENT = 3, BASELINE = 5; docs/alerts.md):
- entropy 1 -> 0.1: drop at 22 = 1 - (1 + .1 + .1) / 3 = 0.6 (warning), at 23 = 0.9 (critical);
- length 60 -> 90, 120, 150 on a flat outcome: rise at 22 = 90 / 60 - 1 = 0.5 (warning), at 23 = 1.0;
- half the answers a loop: share at 21 = 0.5 / 3 = 0.17 (warning), at 22 = 0.33 (critical);
- half the answers without the format marker: drop at 22 = 1 - (1 + .5 + .5) / 3 = 0.33, at 23 = 0.5;
- one answer in four env_error: share at 21 = 0.083 (warning), 22 = 0.17, 23 = 0.25 (critical);
- every group all-correct: zero-variance share at 22 = 0.67 (warning), at 23 = 1.0 (critical).
Group monitors alert overall (dataset None) and for the dataset ("toy"); trainer monitors overall only.
"""

from __future__ import annotations

import random

import pytest

from tests.service.alerts.helpers import group, healthy_metrics, run_versions, text_of

START, LAST, GROUPS = 21, 23, 4
LOOP = "the answer is " * 300


def _groups(v: int, pathology: str | None, rng: random.Random) -> list[dict]:
    sick = pathology is not None and v >= START
    out = []
    for i in range(GROUPS):
        answers = ["42", "42", "7", "7"]
        rng.shuffle(answers)
        if sick and pathology == "saturation":
            answers = ["42"] * 4
        length = 60 + (30 * (v - START + 1) if sick and pathology == "length" else 0)
        texts = [text_of(rng, 1200) for _ in answers]
        marks = ["Final answer:"] * 4
        reasons = ["stop"] * 4
        if sick and pathology == "repetition":
            texts[:2] = [LOOP, LOOP]
        if sick and pathology == "format":
            marks[:2] = ["", ""]
        if sick and pathology == "errors":
            reasons[answers.index("42")] = "env_error"
        out.append(group(f"g-{v}-{i}", v, answers, lengths=[length] * 4, prompt_id=f"p-{i}", reasons=reasons,
                         texts=[f"{t} {m}" for t, m in zip(texts, marks, strict=True)]))
    return out


def run(api, scorer, pathology: str | None, last: int, seed: int = 0) -> dict[int, set]:
    """{version: the transitions it caused} for the versions that caused any (the worker drains every version)."""
    rng = random.Random(seed)

    def version(v: int) -> tuple[dict[str, float], dict]:
        metrics = healthy_metrics(rng)
        if pathology == "entropy" and v >= START:
            metrics["entropy"] = 0.1
        return metrics, {"groups": _groups(v, pathology, rng)}

    return run_versions(api, scorer, last, version)


def both(monitor: str, state: str) -> set:
    return {(monitor, None, state), (monitor, "toy", state)}


EXPECTED = {
    "entropy": {22: {("entropy_collapse", None, "warning")}, 23: {("entropy_collapse", None, "critical")}},
    "length": {22: both("length_hacking", "warning"), 23: both("length_hacking", "critical")},
    "repetition": {21: both("repetition", "warning"), 22: both("repetition", "critical")},
    "format": {22: both("format_collapse", "warning"), 23: both("format_collapse", "critical")},
    "errors": {21: both("error_rate", "warning"), 23: both("error_rate", "critical")},
    "saturation": {22: both("zero_variance_saturation", "warning"), 23: both("zero_variance_saturation", "critical")},
}


@pytest.mark.slow
@pytest.mark.parametrize("pathology", sorted(EXPECTED))
def test_each_pathology_raises_its_alert_at_the_expected_version_and_no_other(api, scorer, pathology):
    assert run(api, scorer, pathology, LAST) == EXPECTED[pathology]
