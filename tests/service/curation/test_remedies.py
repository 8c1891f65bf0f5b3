"""Resample in place on a real PostgreSQL and the real worker: a resample member makes its group wait for a
replacement of that slot; a producer fills it (the group is scored and curated with it); the deadline
trains with what the group has; a producer that ignores the request changes nothing but the wait."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text

from filters.advantages import compute_advantages
from filters.types import AdvantageConfig
from service.worker.pipeline import drain
from tests.helpers import assert_client_error, make_group, make_trajectory, register_spec

SPEC = {"name": "math", "components": [{"name": "correct", "kind": "verifier.math", "outcome": True}]}


def _setup(api, name: str, **policy) -> None:
    register_spec(api, SPEC)
    body = {"name": name, "finish_reason_actions": {"length": "resample"}, **policy}
    assert api.post("/v1/curation-policies", json=body).status_code == 201
    assert api.put(f"/v1/datasets/{name}", json={"reward_spec": "math", "curation_policy": name}).status_code == 200


def _cut_group(gid: str, dataset: str, prompt_id: str) -> dict:
    """3 completers [right, wrong, right] + a member cut at the budget."""
    g = make_group(gid, prompt_id=prompt_id, dataset=dataset, answers=["42", "41", "42", "7"])
    g["trajectories"][3]["finish_reason"] = "length"
    return g


def _advantages(group: dict) -> list[float | None]:
    return [t["advantage"] for t in group["trajectories"]]


def _rules(group: dict) -> list[tuple[int | None, str, str]]:
    return [(d["index"], d["action"], d["rule"]) for d in group["decisions"]]


def test_a_resample_fills_its_own_slot_and_the_group_is_curated_with_it(api, scorer):
    _setup(api, "inplace", resample_wait_seconds=3600)
    assert api.post("/v1/groups", json=_cut_group("g", "inplace", "p")).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    g = api.get("/v1/groups/g").json()
    assert g["status"] == "waiting"
    assert (3, "resample", "remedy_requested") in _rules(g)

    [req] = api.get("/v1/sampling/requests", params={"producer_id": "p1", "n": 5}).json()["requests"][:1]
    assert (req["reason"], req["group_id"], req["index"], req["n"]) == ("resample", "g", 3, 1)
    assert req["budget"]["max_tokens"] == 32  # 16 x the default multiplier 2
    assert req["checkpoint"] is None

    replacement = {"policy_version": 1, "trajectory": make_trajectory(answer="42", seed=9)}
    r = api.post("/v1/groups/g/trajectories/3", json=replacement)
    assert r.status_code == 201, r.text
    assert r.json()["group_status"] == "received" and r.json()["open_slots"] == 0
    again = api.post("/v1/groups/g/trajectories/3", json=replacement)
    assert again.status_code == 200 and again.json()["request_id"] == r.json()["request_id"]
    other = {"policy_version": 1, "trajectory": make_trajectory(answer="41", seed=10)}
    assert_client_error(api.post("/v1/groups/g/trajectories/3", json=other), "index", (409,))

    drain(api.factory, scorer, timeout_s=60)
    g = api.get("/v1/groups/g?include_tokens=true").json()
    assert g["status"] == "ready"
    totals = [t["total_reward"] for t in g["trajectories"]]
    assert totals == [1.0, 0.0, 1.0, 1.0]  # the replacement answered right
    ref = compute_advantages(np.array(totals), AdvantageConfig(), np.zeros(4, dtype=bool))
    np.testing.assert_allclose(_advantages(g), ref)
    assert g["trajectories"][3]["action"] == "keep" and g["trajectories"][3]["advantage"] > 0
    # the replacement's generated tokens are tagged with the version that sampled them
    mask = g["trajectories"][3]["loss_mask"]
    assert g["trajectories"][3]["versions"] == [1 if m else -1 for m in mask]
    assert (3, "resample", "remedy_filled") in _rules(g)
    stats = api.get("/v1/stats").json()
    assert stats["remedies"]["resample"] == {"requested": 1, "filled": 1}


def test_the_deadline_trains_with_what_it_has_like_a_producer_that_ignores_the_request(api, scorer):
    """A producer takes the request and never answers: at the deadline the group trains exactly as a
    policy that does not wait (resample_wait_seconds 0) trains it at once, with the slot recorded."""
    _setup(api, "waits", resample_wait_seconds=3600)
    assert api.post("/v1/curation-policies", json={"name": "nowait", "finish_reason_actions": {"length": "resample"},
                                                   "resample_wait_seconds": 0}).status_code == 201
    assert api.put("/v1/datasets/nowait", json={"reward_spec": "math", "curation_policy": "nowait"}).status_code == 200
    assert api.post("/v1/groups", json=_cut_group("w", "waits", "pw")).status_code == 201
    assert api.post("/v1/groups", json=_cut_group("n", "nowait", "pn")).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    assert api.get("/v1/groups/w").json()["status"] == "waiting"
    assert api.get("/v1/groups/n").json()["status"] == "ready"
    taken = api.get("/v1/sampling/requests", params={"producer_id": "lazy", "n": 10, "dataset": "waits"}).json()
    slot = [r for r in taken["requests"] if r.get("group_id") == "w"]
    assert len(slot) == 1
    assert api.post("/v1/sampling/requests/done", json={"request_ids": [slot[0]["request_id"]]}).status_code == 200
    drain(api.factory, scorer, timeout_s=30)
    assert api.get("/v1/groups/w").json()["status"] == "waiting"  # done without a fill: still waiting
    with api.factory.begin() as s:  # the deadline passes (no clock in tests: move it)
        s.execute(text("UPDATE groups SET wait_until = now() - interval '1 second' WHERE id = 'w'"))
    drain(api.factory, scorer, timeout_s=60)
    w, n = api.get("/v1/groups/w").json(), api.get("/v1/groups/n").json()
    assert w["status"] == "ready"
    np.testing.assert_allclose(_advantages(w), _advantages(n))
    assert w["trajectories"][3]["action"] == "resample" and w["trajectories"][3]["advantage"] == 0.0
    assert (3, "resample", "remedy_unfilled") in _rules(w)
    late = {"policy_version": 0, "trajectory": make_trajectory(answer="42", seed=3)}
    assert_client_error(api.post("/v1/groups/w/trajectories/3", json=late), "index", (409,))
    assert api.get("/v1/stats", params={"dataset": "waits"}).json()["remedies"]["resample"] == {
        "requested": 1, "unfilled": 1}


def test_one_slot_filled_the_other_expired(api, scorer):
    _setup(api, "two", resample_wait_seconds=3600)
    g = make_group("t", prompt_id="pt", dataset="two", answers=["42", "41", "42", "7", "7"], n=5)
    for i in (3, 4):
        g["trajectories"][i]["finish_reason"] = "length"
    assert api.post("/v1/groups", json=g).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    fill = {"policy_version": 0, "trajectory": make_trajectory(answer="41", seed=5)}
    r = api.post("/v1/groups/t/trajectories/4", json=fill)
    assert r.status_code == 201 and r.json()["open_slots"] == 1 and r.json()["group_status"] == "waiting"
    with api.factory.begin() as s:
        s.execute(text("UPDATE groups SET wait_until = now() - interval '1 second' WHERE id = 't'"))
    drain(api.factory, scorer, timeout_s=60)
    t = api.get("/v1/groups/t").json()
    assert t["status"] == "ready"
    assert [x["total_reward"] for x in t["trajectories"]][4] == 0.0  # the fill was scored
    assert t["trajectories"][4]["action"] == "keep" and t["trajectories"][3]["action"] == "resample"
    ref = compute_advantages(np.array([1.0, 0.0, 1.0, 0.0]), AdvantageConfig(), np.zeros(4, dtype=bool))
    np.testing.assert_allclose([_advantages(t)[i] for i in (0, 1, 2, 4)], ref)
    assert {(3, "remedy_unfilled"), (4, "remedy_filled")} <= {(i, rule) for i, _a, rule in _rules(t)}


@pytest.mark.parametrize(("path", "body", "field", "status"), [
    ("/v1/groups/b/trajectories/9", {"policy_version": 0, "trajectory": make_trajectory()}, "index", (422,)),
    ("/v1/groups/nope/trajectories/0", {"policy_version": 0, "trajectory": make_trajectory()}, "group_id", (404,)),
    ("/v1/groups/b/trajectories/0", {"policy_version": 0, "trajectory": make_trajectory()}, "index", (409,)),
    ("/v1/groups/b/trajectories/3", {"policy_version": 0, "trajectory": make_trajectory(versions=[0, 1])},
     "versions", (422,)),
    ("/v1/groups/b/trajectories/3", {"policy_version": -1, "trajectory": make_trajectory()}, "policy_version", (422,)),
    ("/v1/groups/b/trajectories/3", {"trajectory": make_trajectory()}, "policy_version", (422,)),
])
def test_bad_fills_name_the_field_and_store_nothing(api, scorer, path, body, field, status):
    _setup(api, "bad", resample_wait_seconds=3600)
    assert api.post("/v1/groups", json=_cut_group("b", "bad", "pb")).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    before = api.get("/v1/groups/b?include_tokens=true").json()
    assert_client_error(api.post(path, json=body), field, status)
    after = api.get("/v1/groups/b?include_tokens=true").json()
    assert after == before


def test_a_filled_group_goes_back_through_scoring_with_its_death_allowance_reset(api, scorer):
    """A group sent back to scoring by a fill starts over like a rescore: attempts and worker deaths 0."""
    _setup(api, "deaths", resample_wait_seconds=3600)
    assert api.post("/v1/groups", json=_cut_group("d", "deaths", "p")).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    assert api.get("/v1/groups/d").json()["status"] == "waiting"
    with api.factory.begin() as s:  # worker deaths it counted before it waited
        s.execute(text("UPDATE groups SET score_deaths = 3, death_tokens = '{a,b,c}' WHERE id = 'd'"))
    fill = {"policy_version": 1, "trajectory": make_trajectory(answer="42", seed=9)}
    assert api.post("/v1/groups/d/trajectories/3", json=fill).status_code == 201
    with api.factory() as s:
        row = s.execute(text("SELECT status, score_attempts, score_deaths, death_tokens FROM groups WHERE id = 'd'")).one()
    assert tuple(row) == ("received", 0, 0, [])
