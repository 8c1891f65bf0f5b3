"""The score / curate worker under poison and failure, on a real PostgreSQL: one bad group never stops the
others, a claim that expired cannot be written back, retries outlast an outage, the policy's per-member
``reward_error`` action applies, and a group that kills its worker runs out of attempts."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from sqlalchemy import func, select, text

from reward_models.scoring import Scorer
from service.curation import repository as curate_repo
from service.scoring import stage as scoring
from service.store.db import get_engine, make_sessionmaker
from service.store.models import Decision, Group, Reward
from service.worker import repository as repo
from service.worker.pipeline import PipelineConfig, drain, run_once
from tests.conftest import ROOT, start_score_worker
from tests.forked_cli import ForkedProcess
from tests.helpers import make_group, register_spec
from tests.reward_models.conftest import FakeOpenAIServer


@pytest.fixture
def judge():
    server = FakeOpenAIServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def judge_scorer(judge):
    """A scorer whose deployment configures the judge endpoint 'fake' (judge URLs are not spec params)."""
    from reward_models.llm_judge import JudgeEndpoint

    endpoint = JudgeEndpoint(url=judge.base_url, max_retries=0, timeout_s=5)
    with Scorer(processes=1, timeout_s=20, judge_endpoints={"fake": endpoint}) as s:
        yield s


def _judge_spec(api, judge, name="judged"):
    from reward_models.spec import RewardSpec
    from service.specs import service as specs

    spec = RewardSpec.model_validate({"name": name, "components": [
        {"name": "judge", "kind": "judge.llm", "weight": 1.0, "outcome": True,
         "params": {"endpoint": "fake", "model": "fake", "cache_size": 0}}]})
    with api.factory.begin() as s:
        specs.create_reward_spec(s, spec)


def _status(api, gid):
    return api.get(f"/v1/groups/{gid}").json()


def _decisions(api, rule):
    with api.factory() as s:
        return list(s.execute(select(Decision.group_pk, Decision.reason).where(Decision.rule == rule)))


class TestPoisonAmongGood:
    def test_spec_that_vanished_is_one_groups_reward_error(self, api, scorer):
        for i in range(3):
            api.post("/v1/groups", json=make_group(f"good-{i}", prompt_id=f"p{i}", answers=["42", "41", "42", "1"]))
        api.post("/v1/groups", json=make_group("ghost", prompt_id="pg", answers=["42", "41", "42", "1"]))
        with api.factory.begin() as s:  # stored before specs were checked at the door
            s.execute(text("UPDATE prompts SET reward_spec = 'no-such-spec' WHERE id = 'pg'"))
        drain(api.factory, scorer, batch=8)
        assert [_status(api, f"good-{i}")["status"] for i in range(3)] == ["ready"] * 3
        assert _status(api, "ghost")["status"] == "reward_error"
        [(_, reason)] = _decisions(api, "reward_error")
        assert "no-such-spec" in reason

    def test_unknown_spec_is_refused_at_the_door_and_nothing_stored(self, api):
        group = make_group("door")
        group["prompt"]["reward_spec"] = "no-such-spec"
        r = api.post("/v1/groups", json=group)
        assert r.status_code == 422 and "prompt.reward_spec" in r.text
        r = api.post("/v1/prompts", json={"prompts": [{"id": "x", "dataset": "d", "messages": [],
                                                       "reference": {}, "curation_policy": "nope"}]})
        assert r.status_code == 422 and "prompts[0].curation_policy" in r.text
        with api.factory() as s:
            assert s.scalar(select(func.count()).select_from(Group)) == 0
            assert s.scalar(text("SELECT count(*) FROM prompts")) == 0

    def test_policy_metric_the_spec_lacks_is_one_groups_curation_error(self, api, scorer):
        r = api.post("/v1/curation-policies", json={"name": "bad", "zero_variance": {"metric": "nosuch"}})
        assert r.status_code == 201, r.text
        api.put("/v1/datasets/badds", json={"curation_policy": "bad"})
        api.post("/v1/groups", json=make_group("good", prompt_id="p1", answers=["42", "41", "42", "1"]))
        api.post("/v1/groups", json=make_group("bad", prompt_id="p2", dataset="badds", answers=["42", "41", "42", "1"]))
        result = drain(api.factory, scorer, batch=8)
        assert _status(api, "good")["status"] == "ready"
        assert _status(api, "bad")["status"] == "curation_error" and result.curation_errors == 1
        [(_, reason)] = _decisions(api, "curation_error")
        assert "nosuch" in reason

    def test_token_less_group_never_reaches_a_trainer(self, api, scorer):
        bare = make_group("bare", prompt_id="pb", answers=["42", "41", "42", "1"])
        for t in bare["trajectories"][1:2]:
            del t["token_ids"], t["loss_mask"], t["logprobs"]
        api.post("/v1/groups", json=bare)
        api.post("/v1/groups", json=make_group("ok", prompt_id="po", answers=["42", "41", "42", "1"]))
        drain(api.factory, scorer)
        g = _status(api, "bare")
        assert (g["status"], g["drop_reason"]) == ("dropped", "untrainable")
        [(_, reason)] = _decisions(api, "untrainable")
        assert "trajectory 1" in reason and "token_ids" in reason
        batch = api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10}).json()
        assert [grp["id"] for grp in batch["groups"]] == ["ok"]


class TestClaims:
    def test_expired_claim_taken_over_cannot_write(self, api, scorer):
        api.post("/v1/groups", json=make_group("fenced", answers=["42", "41", "42", "1"]))
        with api.factory.begin() as s:
            pks = repo.claim_received(s, "worker-A", 10, 0.2, 10)
        with api.factory() as s:
            job_a = scoring.prepare(s, "worker-A", pks)
        time.sleep(0.3)  # A's claim expires while it "scores"; B claims and finishes the group
        assert run_once(api.factory, scorer).ready == 1
        with api.factory() as s:
            rewards_before = s.scalar(select(func.count()).select_from(Reward))
        scoring.score(scorer, job_a)
        with api.factory.begin() as s:
            out = scoring.write(s, job_a, 10, scoring.Backoff())
        assert (out.fenced, out.scored, out.retried) == (1, [], 0)
        with api.factory() as s:
            g = s.execute(select(Group)).scalar_one()
            # A's expired claim looks like a dead worker's: its attempt was given back (and a death counted)
            assert (g.status, g.score_attempts, g.score_deaths, g.claimed_by) == ("ready", 1, 1, None)
            assert s.scalar(select(func.count()).select_from(Reward)) == rewards_before

    def test_live_claim_keeps_other_workers_off(self, api, scorer):
        api.post("/v1/groups", json=make_group("held"))
        with api.factory.begin() as s:
            assert repo.claim_received(s, "A", 10, 60, 10)
        assert run_once(api.factory, scorer).worked == 0
        with api.factory() as s:
            assert s.execute(select(Group.status)).scalar_one() == "received"

    def test_group_that_kills_its_worker_alone_is_ended_as_the_killer(self, api, scorer):
        api.post("/v1/groups", json=make_group("killer"))
        for n in range(3):  # three workers claim it alone and die before writing anything
            with api.factory.begin() as s:
                assert repo.claim_received(s, f"dead-{n}", 10, 0.05, 3, 2)
            time.sleep(0.1)
        result = run_once(api.factory, scorer, max_attempts=3, max_solo_deaths=2)
        g = _status(api, "killer")
        assert g["status"] == "reward_error" and result.failed == 1
        [(_, reason)] = _decisions(api, "reward_error")
        assert "died 3 times while it was scored alone" in reason


class TestRetries:
    def test_backoff_grows_with_jitter_and_reaches_the_cap(self):
        b = scoring.Backoff(base_s=1.0, max_s=300.0)
        for n, cap in [(1, 1.0), (2, 2.0), (5, 16.0), (9, 256.0), (10, 300.0), (40, 300.0)]:
            delays = [b.delay(n) for _ in range(200)]
            assert cap / 2 <= min(delays) and max(delays) <= cap and len(set(delays)) > 1

    def test_judge_down_longer_than_the_old_retry_window_recovers(self, api, judge_scorer, judge):
        scorer = judge_scorer
        up_at = time.monotonic() + 4.0  # the old schedule (1 s, 2 s, then reward_error) gave up at ~3 s
        judge.default = lambda body: ("status", 503) if time.monotonic() < up_at else (
            ("answer", "Score: 9") if "boxed{42}" in body["messages"][-1]["content"] else ("answer", "Score: 1"))
        _judge_spec(api, judge)
        api.put("/v1/datasets/toy", json={"reward_spec": "judged"})
        api.post("/v1/groups", json=make_group("outage", answers=["42", "41", "42", "1"]))
        cfg = PipelineConfig(backoff_base_s=0.25, backoff_max_s=2.0, max_attempts=12)
        deadline = time.monotonic() + 40
        while _status(api, "outage")["status"] == "received" and time.monotonic() < deadline:
            run_once(api.factory, scorer, cfg)
            time.sleep(0.05)
        g = _status(api, "outage")
        assert g["status"] == "ready", (g["drop_reason"], g["score_error"], g["trajectories"], g["decisions"])
        assert [t["action"] for t in g["trajectories"]] == ["keep"] * 4

    @pytest.mark.parametrize(("action", "status", "actions"), [
        ("drop", "ready", ["keep", "drop", "keep", "keep"]),
        ("drop_group", "dropped", ["drop"] * 4),
    ])
    def test_per_member_reward_error_action(self, api, judge_scorer, judge, action, status, actions):
        scorer = judge_scorer
        judge.default = lambda body: ("status", 500) if "BOOM" in body["messages"][-1]["content"] else (
            ("answer", "Score: 9") if "boxed{42}" in body["messages"][-1]["content"] else ("answer", "Score: 1"))
        _judge_spec(api, judge)
        r = api.post("/v1/curation-policies", json={"name": "p", "reward_error": action})
        assert r.status_code == 201, r.text
        api.put("/v1/datasets/toy", json={"reward_spec": "judged", "curation_policy": "p"})
        api.post("/v1/groups", json=make_group("member", answers=["42", "BOOM", "42", "1"]))
        drain(api.factory, scorer, max_attempts=1)
        g = _status(api, "member")
        assert g["status"] == status
        assert [t["action"] for t in g["trajectories"]] == actions
        assert g["trajectories"][1]["reason"] == "reward_error" and g["trajectories"][1]["total_reward"] is None
        assert g["trajectories"][0]["total_reward"] is not None
        # attack: under drop_group every member carries reason reward_error, and /v1/stats took that as
        # each member's own error, so the group's pass_rate vanished while the curriculum counted the
        # members that scored. pass_rate counts the members that scored, either way.
        scored = [t["outcome"] for t in g["trajectories"] if t["total_reward"] is not None]
        assert len(scored) == 3 and None not in scored
        rows = {r["key"]: r for r in api.get("/v1/stats", params={"by": "dataset"}).json()["rows"]}
        assert rows["toy"]["pass_rate"] == pytest.approx(sum(scored) / 3)


def test_reordered_keys_retry_is_the_same_group(api):
    first = make_group("order", sampling={"temperature": 1.0, "max_tokens": 16, "top_p": 0.9})
    again = make_group("order", sampling={"top_p": 0.9, "max_tokens": 16, "temperature": 1})
    assert api.post("/v1/groups", json=first).status_code == 201
    assert api.post("/v1/groups", json=again).status_code == 200
    other = make_group("order", sampling={"top_p": 0.8, "max_tokens": 16, "temperature": 1})
    assert api.post("/v1/groups", json=other).status_code == 409


def _exact_spec(api):
    r = api.post("/v1/reward-specs", json={"name": "exact", "components": [
        {"name": "correct", "kind": "verifier.math", "weight": 1.0, "outcome": True}]})
    assert r.status_code == 201, r.text


class TestRescore:
    def test_rescore_does_not_double_count_pass_rates(self, api, scorer):
        _exact_spec(api)
        api.post("/v1/groups", json=make_group("rs", answers=["42", "41", "42", "1"]))
        drain(api.factory, scorer)
        with api.factory() as s:
            before = s.execute(text("SELECT n_groups, pass_rate, recent_outcomes FROM prompts")).one()
        assert before == (1, 0.5, [0.5])
        assert api.post("/v1/rescore", json={"reward_spec": "exact"}).json()["groups"] == 1
        drain(api.factory, scorer)
        with api.factory() as s:
            assert s.execute(text("SELECT n_groups, pass_rate, recent_outcomes FROM prompts")).one() == before

    def test_rescore_fences_off_a_worker_scoring_the_old_request(self, api, scorer):
        _exact_spec(api)
        api.post("/v1/groups", json=make_group("rf", answers=["42", "41", "42", "1"]))
        with api.factory.begin() as s:
            pks = repo.claim_received(s, "old-worker", 10, 600, 10)
        with api.factory() as s:
            job = scoring.prepare(s, "old-worker", pks)
        assert api.post("/v1/rescore", json={"reward_spec": "exact"}).json()["groups"] == 1
        scoring.score(scorer, job)
        with api.factory.begin() as s:
            assert scoring.write(s, job, 10, scoring.Backoff()).fenced == 1
        assert run_once(api.factory, scorer).ready == 1


def test_concurrent_outcome_updates_in_opposite_orders_never_deadlock(api):
    for pid in ("pa", "pb", "pc"):
        api.post("/v1/groups", json=make_group(f"g-{pid}", prompt_id=pid))
    orders = [[("pa", 1.0), ("pb", 0.0), ("pc", 1.0)], [("pc", 0.0), ("pb", 1.0), ("pa", 0.0)]]
    barrier, errors = threading.Barrier(2), []

    def work(rows):
        for _ in range(25):
            barrier.wait()
            try:
                with api.factory.begin() as s:
                    curate_repo.record_outcomes(s, rows)
            except Exception as exc:  # a deadlock aborts one transaction
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(o,)) for o in orders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with api.factory() as s:
        assert s.execute(text("SELECT array_agg(n_groups ORDER BY id) FROM prompts")).scalar_one() == [50, 50, 50]


def _judge_env_spec(api, name: str, judge, timeout_s: float) -> dict[str, str]:
    """Store a judge spec naming the deployment endpoint 'fake' -> the env that configures it for a worker
    (judge URLs are deployment settings: GRPO_CURATOR_JUDGE_ENDPOINTS)."""
    from reward_models.spec import RewardSpec
    from service.specs import service as specs

    spec = RewardSpec.model_validate({"name": name, "components": [
        {"name": "judge", "kind": "judge.llm", "weight": 1.0, "outcome": True,
         "params": {"endpoint": "fake", "model": "fake", "cache_size": 0}}]})
    with api.factory.begin() as s:
        specs.create_reward_spec(s, spec)
    endpoint = {"url": judge.base_url, "max_retries": 0, "timeout_s": timeout_s}
    return {"GRPO_CURATOR_JUDGE_ENDPOINTS": json.dumps({"fake": endpoint})}


# -- 6. a group that kills its worker takes the good groups of its claim down with it -------------------
# Attack: a group whose scoring kills the worker used up the attempts of every good group in its claim.
def test_worker_killing_group_does_not_take_its_claim_neighbours_down(api, fresh_db):
    """Attempts are counted at claim time for the whole claimed batch. A group whose scoring kills the
    worker (here: the judge hangs on it and the worker is SIGKILLed, as the OOM killer would) is claimed
    again together with the same good neighbours (ORDER BY pk) each time, so after max_attempts kills the
    good groups end 'reward_error' ('did not finish') with it, although nothing is wrong with them."""
    from tests.reward_models.conftest import FakeOpenAIServer

    judge = FakeOpenAIServer()
    hit = threading.Event()

    def behave(body: dict):
        if "POISON" in json.dumps(body):
            hit.set()
            return ("sleep", 30, "Score: 5")
        return ("answer", "Score: 7" if "fine 1" in json.dumps(body) else "Score: 3")  # variance: not dropped

    judge.default = behave
    threading.Thread(target=judge.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    judge_env = _judge_env_spec(api, "judged", judge, 60)
    ids = ["poison", "good-a", "good-b", "good-c"]  # the poison first: the lowest pk
    for gid in ids:
        answers = ["POISON 1", "POISON 2"] if gid == "poison" else ["fine 1", "fine 2"]
        g = make_group(gid, prompt_id=f"wk-{gid}", answers=answers)
        g["prompt"]["reward_spec"] = "judged"
        assert api.post("/v1/groups", json=g).status_code in (200, 201)

    env = {**os.environ, **judge_env, "PYTHONPATH": str(ROOT), "DATABASE_URL": fresh_db, "GRPO_CURATOR_LOG_LEVEL": "warning",
           "GRPO_CURATOR_MAX_SCORE_ATTEMPTS": "3", "GRPO_CURATOR_SCORE_CLAIM_SECONDS": "2",
           "GRPO_CURATOR_SCORE_BACKOFF_BASE_S": "0.1", "GRPO_CURATOR_SCORE_BACKOFF_MAX_S": "0.5",
           "GRPO_CURATOR_WORKER_POLL_SECONDS": "0.2"}
    def start() -> ForkedProcess:
        return start_score_worker(env, "--processes", "1", "--batch", "8")

    def status(gid: str) -> str:
        return api.get(f"/v1/groups/{gid}").json()["status"]

    proc, kills = start(), 0
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and any(status(g) == "received" for g in ids):
            if hit.wait(0.2):  # the worker is scoring the poison: it dies
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                kills += 1
                hit.clear()
                proc = start()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        judge.shutdown()
        judge.server_close()
    assert kills >= 1
    assert status("poison") == "reward_error"
    assert {g: status(g) for g in ids[1:]} == {g: "ready" for g in ids[1:]}


# -- 7. scoring slower than the claim: two workers steal each other's claims until the attempts run out --
# Attack: scoring slower than the claim: two workers stole each other's claims until the attempts ran out.
def test_scoring_slower_than_the_claim_still_finishes_with_two_workers(api, fresh_db):
    """A claim is never renewed while its worker scores. When one batch takes longer than
    ``score_claim_seconds`` (a slow or rate-limited judge), the second worker re-claims it (an attempt),
    the first worker's write is fenced off, the first re-claims it back (another attempt)... every write
    is refused and the groups end 'reward_error' ('did not finish') although the judge answers every call."""
    from tests.reward_models.conftest import FakeOpenAIServer

    judge = FakeOpenAIServer()
    judge.default = lambda body: ("sleep", 3.0, "Score: 7" if "a 1" in json.dumps(body) else "Score: 3")
    threading.Thread(target=judge.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    judge_env = _judge_env_spec(api, "slow", judge, 30)
    ids = [f"slow-{i}" for i in range(2)]
    for gid in ids:
        g = make_group(gid, prompt_id=f"sp-{gid}", answers=["a 1", "a 2"])
        g["prompt"]["reward_spec"] = "slow"
        assert api.post("/v1/groups", json=g).status_code in (200, 201)

    env = {**os.environ, **judge_env, "PYTHONPATH": str(ROOT), "DATABASE_URL": fresh_db, "GRPO_CURATOR_LOG_LEVEL": "warning",
           "GRPO_CURATOR_MAX_SCORE_ATTEMPTS": "4", "GRPO_CURATOR_SCORE_CLAIM_SECONDS": "1.5",
           "GRPO_CURATOR_WORKER_POLL_SECONDS": "0.1"}
    procs = [start_score_worker(env, "--processes", "1", "--batch", "8") for _ in range(2)]

    def status(gid: str) -> str:
        return api.get(f"/v1/groups/{gid}").json()["status"]

    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and any(status(g) == "received" for g in ids):
            time.sleep(0.5)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        judge.shutdown()
        judge.server_close()
    final = {g: api.get(f"/v1/groups/{g}").json() for g in ids}
    assert {g: v["status"] for g, v in final.items()} == {g: "ready" for g in ids}, \
        [(v.get("score_error"), [d["reason"] for d in v.get("decisions", [])]) for v in final.values()]


# Attack: a reported 1e308 stored total=inf and every curate pass raised: nothing curated.
def test_worker_one_reported_huge_value_does_not_stall_curation_of_other_groups(app_client) -> None:
    c, url = app_client
    register_spec(c, {"name": "envw", "components": [
        {"name": "env", "kind": "external.reported", "weight": 2.0, "outcome": True}]})
    assert c.put("/v1/datasets/toy", json={"reward_spec": "envw"}).status_code == 200
    poison, normal = make_group("g-poison", prompt_id="p-1", n=3), make_group("g-normal", prompt_id="p-2", n=3)
    for t, v in zip(poison["trajectories"], [1e308, 0.0, 0.5], strict=True):
        t.setdefault("metadata", {})["reward"] = v  # an environment (or a policy gaming it) reports 1e308
    for t, v in zip(normal["trajectories"], [1.0, 0.0, 0.5], strict=True):
        t.setdefault("metadata", {})["reward"] = v
    assert c.post("/v1/groups", json={"groups": [poison, normal]}).status_code == 201
    factory = make_sessionmaker(get_engine(url))
    with Scorer(processes=1, timeout_s=10) as scorer:
        # today: the score pass stores total=inf, then every curate pass raises
        # "ValueError: total inf is not finite" (run_forever logs it and retries forever): nothing curates
        drain(factory, scorer, timeout_s=60)
    assert c.get("/v1/groups/g-normal").json()["status"] in ("ready", "dropped")
    assert c.get("/v1/groups/g-poison").json()["status"] != "scored"
