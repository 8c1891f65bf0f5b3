"""The curate stage over real stored groups: advantages stay finite and untrainable groups are set aside."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import select

from reward_models.scoring import Scorer
from service.store.db import get_engine, make_sessionmaker
from service.store.models import Group, Trajectory
from service.worker.pipeline import drain
from tests.helpers import make_group, register_spec, weighted_spec


# Attack: the largest weights / multipliers the API accepts had to give finite advantages through the real pipeline.
def test_the_largest_accepted_values_give_finite_advantages(lenient_api, scorer):
    """Weights of +-1e6 on several components, the largest multiplier and penalty: the real pipeline
    scores and curates every group, with finite totals and advantages (no overflow anywhere)."""
    from service.worker.pipeline import drain

    spec = weighted_spec("edge", [1e6, 1e6, -1e6, 1e6])
    assert lenient_api.post("/v1/reward-specs", json=spec).status_code == 201
    policy = {"name": "edge", "finish_reason_actions": {"length": "resample"}, "resample_budget_multiplier": 16.0,
              "resample_wait_seconds": 0,  # train at once (the waiting path: tests/service/curation/test_remedies.py)
              "penalty": -1e6, "advantage": {"eps": 1e6}}
    assert lenient_api.post("/v1/curation-policies", json=policy).status_code == 201
    assert lenient_api.put("/v1/datasets/edge", json={"reward_spec": "edge", "curation_policy": "edge"}).status_code == 200
    answers = ["42", "41", "42", "7"]
    edge = make_group("edge-g", prompt_id="edge-p", dataset="edge", answers=answers)
    edge["sampling"]["max_tokens"] = 2**31 - 1
    edge["trajectories"][1]["finish_reason"] = "length"
    assert lenient_api.post("/v1/groups", json=edge).status_code == 201
    assert lenient_api.post("/v1/groups", json=make_group("inn", prompt_id="inn-p", answers=answers)).status_code == 201
    drain(lenient_api.factory, scorer, timeout_s=60)
    for gid in ("edge-g", "inn"):
        g = lenient_api.get(f"/v1/groups/{gid}").json()
        assert g["status"] in ("ready", "dropped"), g["status"]
        for t in g["trajectories"]:
            assert t["total_reward"] is not None and math.isfinite(t["total_reward"]), t
            if t["advantage"] is not None:
                assert math.isfinite(t["advantage"]), t
    totals = sorted(t["total_reward"] for t in lenient_api.get("/v1/groups/edge-g").json()["trajectories"])
    assert totals[-1] == pytest.approx(2e6), totals  # 42 is right: 1e6 + 1e6 - 1e6 + 1e6


# Attack: a non-finite total already in the table (older build, manual edit) must set that group aside, not stop its batch.
def test_curation_sets_aside_a_group_whose_stored_total_is_not_finite(app_client) -> None:
    """Defence in depth for the finding above: a non-finite total already in the table (an older build,
    a manual edit) makes curation set that group aside as curation_error; the rest of its batch curates."""
    from sqlalchemy import update

    from service.store.models import Decision
    from service.worker.pipeline import curate_pass

    c, url = app_client
    register_spec(c, {"name": "envs", "components": [{"name": "env", "kind": "external.reported", "outcome": True}]})
    assert c.put("/v1/datasets/toy", json={"reward_spec": "envs"}).status_code == 200
    groups = [make_group(f"g-{i}", prompt_id=f"p-{i}", n=3) for i in range(3)]
    for g in groups:
        for t, v in zip(g["trajectories"], [1.0, 0.0, 0.5], strict=True):
            t.setdefault("metadata", {})["reward"] = v
    assert c.post("/v1/groups", json={"groups": groups}).status_code == 201
    factory = make_sessionmaker(get_engine(url))
    with Scorer(processes=1, timeout_s=10) as scorer:
        drain(factory, scorer, timeout_s=60)
    with factory.begin() as session:  # back to 'scored', with one total that is not finite
        pk = session.scalar(select(Group.pk).where(Group.id == "g-1"))
        session.execute(update(Group).values(status="scored", curated_at=None, ready_at=None))
        session.execute(update(Trajectory).where(Trajectory.group_pk == pk, Trajectory.idx == 0)
                        .values(total_reward=float("inf")))
    with factory.begin() as session:
        result = curate_pass(session, 256)
    assert result.ready + result.dropped == 2
    assert [c.get(f"/v1/groups/g-{i}").json()["status"] for i in range(3)] == ["ready", "curation_error", "ready"]
    with factory() as session:
        reasons = session.scalars(select(Decision.reason).where(Decision.group_pk == pk)).all()
    assert any(r.startswith("curation:") and "not finite" in r for r in reasons), reasons
