"""The score / curate worker on a real PostgreSQL: rewards stored per component, decisions logged,
advantages written, refill and resample requests created, two workers never score a group twice."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select, text

from reward_models.scoring import Scorer
from service.store.models import Decision, Group, Reward, SamplingRequest
from service.worker.pipeline import drain, run_once
from tests.helpers import make_group


def _spec(api, **extra):
    body = {"name": "math", "components": [
        {"name": "correct", "kind": "verifier.math", "weight": 1.0, "outcome": True},
        {"name": "fmt", "kind": "rule.format", "weight": 0.1, "params": {"pattern": r"\\boxed\{"}},
    ]}
    body.update(extra)
    r = api.post("/v1/reward-specs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


class TestScoreAndCurate:
    def test_mixed_group_becomes_ready_with_grpo_advantages(self, api, scorer):
        _spec(api)
        assert api.put("/v1/datasets/toy", json={"reward_spec": "math"}).status_code == 200
        api.post("/v1/groups", json=make_group("mix", answers=["42", "41", "42", "7"]))
        result = drain(api.factory, scorer)
        assert (result.scored, result.ready) == (1, 1)
        g = api.get("/v1/groups/mix").json()
        assert g["status"] == "ready" and g["reward_spec"] == "math@1" and g["curation_policy"] == "default@1"
        outcomes = [t["outcome"] for t in g["trajectories"]]
        assert outcomes == [1.0, 0.0, 1.0, 0.0]
        assert [t["rewards"]["correct"]["value"] for t in g["trajectories"]] == outcomes
        totals = [t["total_reward"] for t in g["trajectories"]]
        assert totals == pytest.approx([1.1, 0.1, 1.1, 0.1])
        # population-std GRPO on totals: mean 0.6, std 0.5 -> +-1
        assert [t["advantage"] for t in g["trajectories"]] == pytest.approx([1, -1, 1, -1], abs=1e-4)
        assert {t["action"] for t in g["trajectories"]} == {"keep"}

    def test_all_correct_group_is_dropped_zero_variance_and_refill_requested(self, api, scorer):
        api.post("/v1/groups", json=make_group("solved"))  # default spec: math outcome, all 42
        drain(api.factory, scorer)
        g = api.get("/v1/groups/solved").json()
        assert g["status"] == "dropped" and g["drop_reason"] == "zero_variance"
        assert any(d["index"] is None and d["rule"] == "zero_variance" for d in g["decisions"])
        with api.factory() as s:
            req = s.execute(select(SamplingRequest)).scalar_one()
            assert (req.reason, req.prompt_id, req.dataset) == ("refill", None, "toy")
            assert s.execute(text("SELECT pass_rate, n_groups FROM prompts")).one() == (1.0, 1)

    def test_truncated_member_masked_and_logged(self, api, scorer):
        group = make_group("trunc", answers=["42", "41", "42", "1"])
        group["trajectories"][3]["finish_reason"] = "length"
        api.post("/v1/groups", json=group)
        drain(api.factory, scorer)
        g = api.get("/v1/groups/trunc").json()
        t3 = g["trajectories"][3]
        assert g["status"] == "ready"
        assert (t3["action"], t3["advantage"], t3["reason"]) == ("mask", 0.0, "finish_reason:length")
        assert any(d["index"] == 3 and d["action"] == "mask" for d in g["decisions"])

    def test_small_budget_overlong_penalty_reaches_the_service_path(self, api, scorer):
        """The service curates with the vectorised path: a 3-token budget must still give the member cut
        at the budget -1 (a 0.2 buffer is one token, not zero), and soft_overlong shapes a `stop` answer
        inside the buffer too."""
        _spec(api)
        body = {"name": "dapo", "finish_reason_actions": {"length": "penalize"}, "soft_overlong": True}
        assert api.post("/v1/curation-policies", json=body).status_code == 201
        assert api.put("/v1/datasets/toy", json={"reward_spec": "math", "curation_policy": "dapo"}).status_code == 200
        group = make_group("tiny-budget", answers=["42", "41", "42", "42"], sampling={"max_tokens": 3})
        lengths = [1, 2, 3, 3]  # 3 = the budget: in the 1-token buffer (stop) or cut (length)
        for t, n in zip(group["trajectories"], lengths, strict=True):
            t["num_tokens"] = n
        group["trajectories"][3]["finish_reason"] = "length"
        api.post("/v1/groups", json=group)
        drain(api.factory, scorer)
        g = api.get("/v1/groups/tiny-budget").json()
        totals = [t["total_reward"] for t in g["trajectories"]]
        assert totals == pytest.approx([1.1, 0.1, 1.1, 1.1])
        assert g["status"] == "ready" and [t["action"] for t in g["trajectories"]] == ["keep"] * 3 + ["penalize"]
        # rewards used 1.1, 0.1, 1.1 - 1, 1.1 - 1: the 3-token stop answer and the cut one both get -1
        adv = [t["advantage"] for t in g["trajectories"]]
        assert adv[0] > 0 > adv[1] and adv[1:] == pytest.approx([adv[1]] * 3, abs=1e-5)

    def test_infrastructure_failure_is_dropped_not_negative(self, api, scorer):
        group = make_group("infra", answers=["42", "41", "42", "41"])
        group["trajectories"][1]["finish_reason"] = "env_error"
        api.post("/v1/groups", json=group)
        drain(api.factory, scorer)
        t1 = api.get("/v1/groups/infra").json()["trajectories"][1]
        assert t1["action"] == "drop" and t1["advantage"] == 0.0


class TestFailures:
    def test_component_error_on_last_attempt_goes_to_curation_reward_error_action(self, api, scorer):
        # a code verifier with no tests in the reference cannot decide -> error, never 0
        api.post("/v1/reward-specs", json={"name": "code", "components": [{"name": "tests", "kind": "verifier.code", "outcome": True}]})
        # ingest refuses a prompt without the tests its spec needs; one posted before the dataset got the
        # code spec (a spec attached later is not re-checked) still reaches the scorer without them
        api.post("/v1/groups", json=make_group("noref", dataset="code", prompt_id="cp", reference={"answer": "42"}))
        api.put("/v1/datasets/code", json={"reward_spec": "code"})
        with api.factory.begin() as s:
            s.execute(text("UPDATE groups SET score_attempts = 2"))
        run_once(api.factory, scorer, max_attempts=3)
        g = api.get("/v1/groups/noref").json()
        # the policy's reward_error action ("drop" the member) drops every member, so the group goes too
        assert g["status"] == "dropped" and g["score_error"]
        assert [(t["action"], t["reason"]) for t in g["trajectories"]] == [("drop", "reward_error")] * 4
        assert all(t["total_reward"] is None for t in g["trajectories"])
        assert all(t["rewards"]["tests"]["error"] and t["rewards"]["tests"]["value"] is None for t in g["trajectories"])

    def test_first_error_schedules_a_retry(self, api, scorer):
        api.post("/v1/reward-specs", json={"name": "code", "components": [{"name": "tests", "kind": "verifier.code", "outcome": True}]})
        # ingest refuses a prompt without the tests its spec needs; one posted before the dataset got the
        # code spec (a spec attached later is not re-checked) still reaches the scorer without them
        api.post("/v1/groups", json=make_group("retry", dataset="code", prompt_id="cp2", reference={"answer": "42"}))
        api.put("/v1/datasets/code", json={"reward_spec": "code"})
        r = run_once(api.factory, scorer, max_attempts=3)
        assert r.retried == 1
        with api.factory() as s:
            g = s.execute(select(Group)).scalar_one()
            assert g.status == "received" and g.score_attempts == 1 and g.retry_at is not None


def test_two_workers_never_score_a_group_twice(api, scorer):
    for i in range(24):
        api.post("/v1/groups", json=make_group(f"par-{i}", prompt_id=f"pp-{i}", answers=["42", "41", "42", "3"]))
    barrier = threading.Barrier(2)
    results = []

    def work():
        with Scorer(processes=1) as own:
            barrier.wait()
            results.append(drain(api.factory, own, batch=4))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.scored for r in results) == 24
    with api.factory() as s:
        # every (trajectory, component) was written exactly once: no duplicate scoring
        assert s.scalar(select(func.count()).select_from(Reward)) == 24 * 4
        assert s.scalar(select(func.count()).where(Group.status == "ready")) == 24
        assert s.scalar(select(func.count()).select_from(Decision)) == 0


class TestRescoreAndRecurate:
    def test_rescore_keeps_both_versions(self, api, scorer):
        _spec(api)
        api.put("/v1/datasets/toy", json={"reward_spec": "math"})
        api.post("/v1/groups", json=make_group("rs", answers=["42", "41", "42", "7"]))
        drain(api.factory, scorer)
        v2 = _spec(api, components=[{"name": "correct", "kind": "verifier.exact_match", "outcome": True}])
        assert v2 == {"name": "math", "version": 2}
        r = api.post("/v1/rescore", json={"reward_spec": "math@2", "dataset": "toy"})
        assert r.json() == {"groups": 1, "reward_spec": "math@2"}
        assert api.get("/v1/groups/rs").json()["status"] == "received"
        drain(api.factory, scorer)
        now = api.get("/v1/groups/rs").json()
        assert now["reward_spec"] == "math@2" and set(now["trajectories"][0]["rewards"]) == {"correct"}
        old = api.get("/v1/groups/rs", params={"spec_version": 1}).json()
        assert set(old["trajectories"][0]["rewards"]) == {"correct", "fmt"}
        with api.factory() as s:
            versions = s.execute(select(Reward.spec_version, func.count()).group_by(Reward.spec_version)).all()
        assert sorted(versions) == [(1, 8), (2, 4)]

    def test_recurate_under_new_policy_keeps_old_decisions(self, api, scorer):
        group = make_group("rc", answers=["42", "41", "42", "1"])
        group["trajectories"][3]["finish_reason"] = "length"
        api.post("/v1/groups", json=group)
        drain(api.factory, scorer)
        assert api.get("/v1/groups/rc").json()["trajectories"][3]["action"] == "mask"
        api.post("/v1/curation-policies", json={"name": "strict", "finish_reason_actions": {"length": "drop"}})
        assert api.post("/v1/recurate", json={"curation_policy": "strict", "group_ids": ["rc"]}).json()["groups"] == 1
        drain(api.factory, scorer)
        g = api.get("/v1/groups/rc").json()
        assert g["curation_policy"] == "strict@1" and g["trajectories"][3]["action"] == "drop"
        logged = {(d["index"], d["action"], d["policy"]) for d in g["decisions"]}
        assert {(3, "mask", "default@1"), (3, "drop", "strict@1")} <= logged
        # statistics count the group once, as last curated: retracted before re-curation
        [row] = api.get("/v1/stats", params={"by": "policy_version"}).json()["rows"]
        assert row["count"] == 4 and row["truncation_rate"]["length"] == 0.25

    def test_unknown_spec_is_422_naming_the_field(self, api):
        r = api.post("/v1/rescore", json={"reward_spec": "nope"})
        assert r.status_code == 422 and "reward_spec" in r.json()["error"]


# -- 2. one curation policy with a large max_staleness breaks the stale-drop pass for everybody ---------
# Attack: one policy's huge max_staleness overflowed the int4 cast and broke the stale-drop pass for everybody.
def test_large_max_staleness_does_not_break_the_maintenance_pass(api):
    """``max_staleness`` is an unbounded int in the policy, but the stale-drop SQL casts it to int4: one
    policy with max_staleness 10**10 makes every maintenance pass raise (DataError), so stale groups of
    every other policy stay 'ready' forever and run_once raises on every pass."""
    for name, ms in (("lenient", 10**10), ("tight", 0)):
        r = api.post("/v1/curation-policies", json={"name": name, "max_staleness": ms})
        assert r.status_code == 201, r.text
    for gid, pol in (("len-1", "lenient"), ("tight-1", "tight")):
        g = make_group(gid, prompt_id=f"p-{gid}", answers=["42", "41", "42", "0"])
        g["prompt"]["curation_policy"] = pol
        assert api.post("/v1/groups", json=g).status_code in (200, 201)
    with Scorer(processes=1, timeout_s=20) as scorer:
        assert drain(api.factory, scorer).ready == 2
        for v in (1, 2):
            assert api.post("/v1/policy", json={"version": v, "metrics": {}}).status_code in (200, 201)
        run_once(api.factory, scorer)  # raised DataError: integer out of range
    assert api.get("/v1/groups/tight-1").json()["status"] == "dropped"
    assert api.get("/v1/groups/len-1").json()["status"] == "ready"
