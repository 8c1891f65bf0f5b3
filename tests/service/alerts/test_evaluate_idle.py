"""The worker's evaluation holds no transaction through its Python work: a worker's connections end a
transaction idle longer than ``worker_idle_in_transaction_s`` (60 s), and scoring a large window takes that
long at scale. Scaled down: a 2 s bound, a 19,200-trajectory window, and its scoring made to take longer than
the bound (``_score`` waits 3 s first), so the test does not rest on how fast this machine scores. The bound
leaves the read step's own gaps between statements room on a loaded machine: 50 ms, then 250 ms, each failed
the split evaluation in a full-suite run (fetching this window's rows between two statements took that long)."""

from __future__ import annotations

import time

from bench import scale
from service.alerts import service as alerts
from service.settings import Settings
from service.store.db import make_sessionmaker, worker_engine
from tests.service.alerts.helpers import publish

IDLE_S = 2.0  # the bound, scaled down from 60 s
SCORE_S = 3.0  # how long scoring takes here: longer than the bound


def test_the_workers_evaluation_survives_a_short_idle_in_transaction_bound(fresh_api, fresh_db, monkeypatch) -> None:
    api = fresh_api
    for v in (1, 2, 3):
        publish(api, v, entropy=0.001)  # collapsed: entropy_collapse goes critical (the write step runs)
    groups = scale.bodies("x", 600, 32, seed=1)
    for g in groups:
        g["policy_version"] = 3
    for s in range(0, len(groups), 200):
        assert api.post("/v1/groups", json={"groups": groups[s:s + 200]}).status_code == 201
    factory = make_sessionmaker(worker_engine(fresh_db, Settings(worker_idle_in_transaction_s=IDLE_S)))
    monkeypatch.setattr(alerts, "_last_run", [float("-inf")])  # due now
    real_score = alerts._score

    def slow_score(reading):  # noqa: ANN001, ANN202 - scoring a window as large as production's
        time.sleep(SCORE_S)
        return real_score(reading)

    monkeypatch.setattr(alerts, "_score", slow_score)
    with factory.begin() as session:  # as the worker's maintenance pass calls it
        alerts.evaluate_due(session)
    opened = {(a["monitor"], a["dataset"], a["state"]) for a in api.get("/v1/alerts").json()["alerts"]}
    assert ("entropy_collapse", None, "critical") in opened


def test_a_settings_change_between_read_and_write_is_read_again(fresh_api, fresh_db, monkeypatch) -> None:
    """The write step re-checks what the scores came from: a threshold changed meanwhile means reading again,
    so no alert moves on settings that are no longer in force (collapsed below the floor: critical at the
    thresholds in force, 60)."""
    api = fresh_api
    for v in (1, 2, 3):
        publish(api, v, entropy=0.001)
    real_score, calls = alerts._score, []

    def score_then_change(reading):  # noqa: ANN001, ANN202
        out = real_score(reading)
        if not calls:  # an admin raises the thresholds while the first pass scores
            r = api.put("/v1/monitors/entropy_collapse", json={"dataset": None, "warning": 50, "critical": 60})
            assert r.status_code == 200
        calls.append(reading.settings)
        return out

    monkeypatch.setattr(alerts, "_score", score_then_change)
    factory = make_sessionmaker(worker_engine(fresh_db, Settings(worker_idle_in_transaction_s=IDLE_S)))
    out = alerts.evaluate_in_steps(factory)
    assert out is not None and len(calls) == 2 and calls[1] != calls[0]  # read again, with the new settings
    assert [(t["to"], t["alert"]["threshold"]) for t in out.transitions] == [("critical", 60.0)]
