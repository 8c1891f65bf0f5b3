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

Versions 1-20 are the same in every run (the same seed, and no pathology draws anything before START): they
run once per module (``healthy_start``, which checks that they raised nothing), and each pathology's run goes
on from a copy of that database with the random stream where it stood, evaluating 21-23 as a run from
version 1 would.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from service.store.db import dispose_engine
from service.store.dbadmin import create_database, freeze_template
from tests.conftest import committing_client
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


def _version_fn(pathology: str | None, rng: random.Random):
    def version(v: int) -> tuple[dict[str, float], dict]:
        metrics = healthy_metrics(rng)
        if pathology == "entropy" and v >= START:
            metrics["entropy"] = 0.1
        return metrics, {"groups": _groups(v, pathology, rng)}

    return version


def run(api, scorer, pathology: str | None, last: int, seed: int = 0, first: int = 1,
        rng_state: Any = None) -> dict[int, set]:
    """{version: the transitions it caused} for the versions that caused any (the worker drains every version);
    ``first`` > 1: a run that goes on from a copy of a database that ran 1..first-1, ``rng_state`` the random
    stream's state there."""
    rng = random.Random(seed)
    if rng_state is not None:
        rng.setstate(rng_state)
    return run_versions(api, scorer, last, _version_fn(pathology, rng), first=first)


@pytest.fixture(scope="module")
def healthy_start(make_db, scorer) -> Iterator[tuple[str, Any]]:
    """Versions 1..START-1 of every run, once: (a database that ran them, to be copied; the random stream's
    state after them). They raise no alert."""
    db = make_db()
    rng = random.Random(0)
    with committing_client(db) as api:
        assert run_versions(api, scorer, START - 1, _version_fn(None, rng)) == {}
    dispose_engine(db)
    freeze_template(make_db.server_url, db)  # no connection while it is copied
    yield db, rng.getstate()
    make_db.retire(db)


@pytest.fixture
def started_api(make_db, healthy_start) -> Iterator:
    """A committing client on a copy of the healthy start's database."""
    template, _ = healthy_start
    url = create_database(make_db.server_url, "gct", template=template)
    make_db.made.append(url)  # dropped with the session's databases if retire() did not get to it
    try:
        with committing_client(url) as api:
            yield api
    finally:
        dispose_engine(url)
        make_db.retire(url)


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
def test_each_pathology_raises_its_alert_at_the_expected_version_and_no_other(started_api, healthy_start, scorer,
                                                                             pathology):
    _, rng_state = healthy_start
    assert run(started_api, scorer, pathology, LAST, first=START, rng_state=rng_state) == EXPECTED[pathology]
