"""A long noisy healthy run through the real API (published trainer metrics, stored groups scored by the real
worker, evaluated after every version) raises no alert. Its own file (the pathologies:
test_synthetic_runs.py): with ``--dist loadfile`` the two run on two workers at once."""

from __future__ import annotations

import random
from collections.abc import Iterator

import psycopg
import pytest

from service.store.dbadmin import libpq_url
from tests.conftest import committing_client
from tests.service.alerts.helpers import group, healthy_metrics, run_versions, text_of

LONG_RUN_VERSIONS = 1000


def _noisy_healthy_group(v: int, rng: random.Random) -> dict:
    """Mixed outcome (1-3 of 4 right), length 60 +- 10 %, random texts with the marker, every one stop."""
    right = rng.randint(1, 3)
    answers = ["42"] * right + ["7"] * (4 - right)
    rng.shuffle(answers)
    lengths = [max(1, round(rng.gauss(60, 6))) for _ in answers]
    texts = [f"{text_of(rng, rng.randint(100, 1500))} Final answer:" for _ in answers]
    return group(f"g-{v}", v, answers, lengths=lengths, texts=texts, prompt_id=f"p-{v % 7}")


@pytest.fixture
def api(fresh_db: str) -> Iterator:
    """``committing_client`` over a fresh database whose commits do not wait for their WAL flush
    (``synchronous_commit = off``, this scratch database only; dropped after the test): the run commits
    ~3,300 writes (3 requests a version, the worker's passes), and waiting for each one's fsync was 10-20 %
    of its time on a 2-core box. What the test checks is the same either way: a commit is visible to the
    next statement at once; only a crash of the server could lose the last ones."""
    with psycopg.connect(libpq_url(fresh_db), autocommit=True) as conn:
        conn.execute("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = off', "
                     "current_database()); END $$")
    with committing_client(fresh_db) as c:
        yield c


DRAIN_EVERY = 10  # the worker scores in batches while evaluations run: up to 9 versions are still unscored


@pytest.mark.slow
def test_a_long_noisy_healthy_run_raises_no_alert(api, scorer):
    """1000 versions of noisy healthy metrics and groups, evaluated after every version while the worker lags
    up to DRAIN_EVERY - 1 versions behind (as a real worker does): the false-positive count is 0, and no
    alert row was ever written."""
    rng = random.Random(1234)

    def version(v: int) -> tuple[dict[str, float], dict]:
        metrics = healthy_metrics(rng)  # drawn before the group: the run's random stream as it always was
        return metrics, _noisy_healthy_group(v, rng)

    false_positives = run_versions(api, scorer, LONG_RUN_VERSIONS, version, drain_every=DRAIN_EVERY)
    print(f"long healthy run: {LONG_RUN_VERSIONS} versions, {len(false_positives)} false positives")
    assert false_positives == {}
    assert api.get("/v1/alerts").json()["alerts"] == []
