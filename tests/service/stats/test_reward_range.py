"""A reported reward beyond the range of a reward (+-1e6) is a component error, not a value: 1e300 is finite,
but its square in the statistics' sums is not, and GET /v1/stats answered 500 for its dataset. Over real
HTTP, a real PostgreSQL and the real worker."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from reward_models.base import MAX_REWARD_MAGNITUDE
from service.worker.pipeline import drain
from tests.helpers import make_group, register_spec


@pytest.mark.parametrize("reported", [1e300, -1e300, MAX_REWARD_MAGNITUDE * 1.5])
def test_a_reward_beyond_the_range_is_an_error_and_stats_still_answer(api, scorer, reported):
    register_spec(api, {"name": "env", "components": [{"name": "env", "kind": "external.reported", "outcome": True}]})
    assert api.put("/v1/datasets/big", json={"reward_spec": "env"}).status_code == 200
    g = make_group("big", prompt_id="p-big", dataset="big", answers=["1", "2", "3", "4"])
    for t, value in zip(g["trajectories"], [reported, 0.0, MAX_REWARD_MAGNITUDE, -MAX_REWARD_MAGNITUDE], strict=True):
        t["metadata"] = {"reward": value}
    assert api.post("/v1/groups", json=g).status_code == 201
    for _ in range(20):  # a component error is retried with backoff: run the retries now, to the end
        drain(api.factory, scorer, timeout_s=60)
        if api.get("/v1/groups/big").json()["status"] != "received":
            break
        with api.factory.begin() as s:
            s.execute(text("UPDATE groups SET retry_at = now() WHERE id = 'big'"))
    got = api.get("/v1/groups/big").json()
    assert got["status"] != "received"
    assert "outside" in got["trajectories"][0]["rewards"]["env"]["error"]
    assert [t["rewards"]["env"]["value"] for t in got["trajectories"][1:]] == [
        0.0, MAX_REWARD_MAGNITUDE, -MAX_REWARD_MAGNITUDE]  # the bound itself is a reward
    for params in ({}, {"dataset": "big"}, {"by": "component"}, {"by": "dataset"}, {"by": "finish_reason"}):
        r = api.get("/v1/stats", params=params)
        assert r.status_code == 200, (params, r.text[:300])
