"""Rescore and recurate change your mind without new rollouts (docs/api.md, section 10): a curated group sent
back asks for no remedy slot and no fresh group, it trains with the members it has (a decision says so), and
its remedy steps are counted once per slot however often it is sent back. Real HTTP, real PostgreSQL, the real
worker."""

from __future__ import annotations

from sqlalchemy import text

from service.worker.pipeline import drain
from tests.helpers import make_group, make_trajectory, register_spec

SPEC = {"name": "math", "components": [{"name": "correct", "kind": "verifier.math", "outcome": True}]}


def _dataset(api, name: str, **policy) -> None:
    assert api.post("/v1/curation-policies", json={"name": name, **policy}).status_code == 201
    assert api.put(f"/v1/datasets/{name}", json={"reward_spec": "math", "curation_policy": name}).status_code == 200


def _cut_group(api, scorer, gid: str, dataset: str) -> None:
    g = make_group(gid, prompt_id=f"p-{gid}", dataset=dataset, answers=["42", "41", "42", "7"])
    g["trajectories"][3]["finish_reason"] = "length"
    assert api.post("/v1/groups", json=g).status_code == 201
    drain(api.factory, scorer, timeout_s=60)


def _send_back(api, scorer, gid: str, policy: str) -> None:
    r = api.post("/v1/rescore", json={"reward_spec": "math", "group_ids": [gid]})
    assert r.status_code == 200 and r.json()["groups"] == 1, r.text
    drain(api.factory, scorer, timeout_s=60)
    r = api.post("/v1/recurate", json={"curation_policy": policy, "group_ids": [gid]})
    assert r.status_code == 200 and r.json()["groups"] == 1, r.text
    drain(api.factory, scorer, timeout_s=60)


def _slot_requests(api) -> list[tuple[str, int | None, str]]:
    with api.factory() as s:
        return [tuple(r) for r in s.execute(text("SELECT reason, idx, status FROM sampling_requests"
                                                 " WHERE reason IN ('resample', 'resume') ORDER BY pk"))]


def test_a_recurate_under_a_waiting_remedy_policy_trains_with_what_it_has(api, scorer):
    register_spec(api, SPEC)
    _dataset(api, "masking")  # length -> mask
    assert api.post("/v1/curation-policies", json={"name": "waits", "finish_reason_actions": {"length": "resample"},
                                                   "resample_wait_seconds": 3600}).status_code == 201
    _cut_group(api, scorer, "g", "masking")
    before = api.get("/v1/groups/g").json()
    assert before["status"] == "ready"
    r = api.post("/v1/recurate", json={"curation_policy": "waits", "group_ids": ["g"]})
    assert r.status_code == 200 and r.json()["groups"] == 1, r.text
    drain(api.factory, scorer, timeout_s=60)
    g = api.get("/v1/groups/g").json()
    assert g["status"] == "ready", g["decisions"]
    assert [t["action"] for t in g["trajectories"]] == ["keep", "keep", "keep", "resample"]
    assert g["trajectories"][3]["rewards"] == before["trajectories"][3]["rewards"]  # the member is still there
    assert _slot_requests(api) == []  # no slot, no fresh group
    rules = [(d["index"], d["rule"]) for d in g["decisions"]]
    assert (None, "recurate") in rules and (3, "no_new_rollouts") in rules, rules
    assert "remedy_requested" not in {rule for _, rule in rules}


def test_without_a_wait_a_cut_member_asks_for_one_fresh_group_however_often_it_is_sent_back(api, scorer):
    register_spec(api, SPEC)
    _dataset(api, "nowait", finish_reason_actions={"length": "resample"}, resample_wait_seconds=0)
    _cut_group(api, scorer, "g", "nowait")
    assert _slot_requests(api) == [("resample", None, "open")]
    for _ in range(2):
        _send_back(api, scorer, "g", "nowait")
    assert _slot_requests(api) == [("resample", None, "open")]
    assert api.get("/v1/summary").json()["open_sampling_requests"] == {"resample": 1}


def test_a_slot_cut_again_is_counted_exhausted_once(api, scorer):
    register_spec(api, SPEC)
    _dataset(api, "ex", finish_reason_actions={"length": "resample"}, resample_wait_seconds=3600)
    _cut_group(api, scorer, "g", "ex")
    cut_again = make_trajectory(answer="42", seed=9, finish_reason="length")
    assert api.post("/v1/groups/g/trajectories/3", json={"policy_version": 0, "trajectory": cut_again}).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    want = {"resample": {"requested": 1, "filled": 1, "exhausted": 1}}
    assert api.get("/v1/stats", params={"dataset": "ex"}).json()["remedies"] == want
    for _ in range(2):
        _send_back(api, scorer, "g", "ex")
    assert api.get("/v1/groups/g").json()["status"] == "ready"
    assert api.get("/v1/stats", params={"dataset": "ex"}).json()["remedies"] == want
