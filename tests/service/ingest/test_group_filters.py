"""GET /v1/groups filters: drop_reason, and groups with a member of a finish_reason / reward range."""

from __future__ import annotations

import pytest

from reward_models.scoring import Scorer
from service.store.db import get_engine, make_sessionmaker
from service.worker.pipeline import drain
from tests.helpers import make_group, make_trajectory


@pytest.fixture
def api(fresh_db):
    from fastapi.testclient import TestClient

    from service.app import create_app

    with TestClient(create_app(database_url=fresh_db)) as c:
        c.post("/v1/groups", json=make_group("mixed", prompt_id="p1", answers=["42", "41", "42", "7"]))
        c.post("/v1/groups", json=make_group("solved", prompt_id="p2", answers=["42", "42", "42", "42"]))
        cut = make_group("cut", prompt_id="p3", answers=["42", "1", "2"])
        cut["trajectories"].append({**make_trajectory(answer="4", seed=9), "finish_reason": "length"})
        c.post("/v1/groups", json=cut)
        with Scorer(processes=1, timeout_s=20) as scorer:
            drain(make_sessionmaker(get_engine(fresh_db)), scorer)
        yield c


def _ids(api, **params):
    r = api.get("/v1/groups", params=params)
    assert r.status_code == 200, r.text
    return sorted(g["id"] for g in r.json()["groups"])


def test_filters(api):
    assert _ids(api) == ["cut", "mixed", "solved"]
    assert _ids(api, drop_reason="zero_variance") == ["solved"]
    assert _ids(api, finish_reason="length") == ["cut"]
    assert _ids(api, finish_reason="stop") == ["cut", "mixed", "solved"]
    assert _ids(api, min_reward=1) == ["cut", "mixed", "solved"]  # every group has a correct member
    assert _ids(api, max_reward=0) == ["cut", "mixed"]  # the solved group has no failing member
    assert _ids(api, min_reward=0.5, max_reward=0.9) == []  # rewards are 0 or 1
    assert _ids(api, finish_reason="length", min_reward=1) == []  # the cut member failed: one member must match all
    assert _ids(api, finish_reason="length", dataset="other") == []


@pytest.mark.parametrize(
    "params",
    [{"finish_reason": "bogus"}, {"min_reward": "nan"}, {"max_reward": "inf"}, {"min_reward": "x"}, {"drop_reason": ""}],
)
def test_bad_filters_are_422(api, params):
    r = api.get("/v1/groups", params=params)
    assert r.status_code == 422, r.text
    assert next(iter(params)) in r.text
