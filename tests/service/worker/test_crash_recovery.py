"""A score worker that dies (kill -9, OOM) hands its groups back within one short claim, and the attempt its
claim lost is not the groups' failure: it neither counts toward ``max_attempts`` nor grows their backoff.
A dead claim is split in halves, each claimed again together; a group whose worker died while it was
claimed alone more than ``max_solo_deaths`` times is the killer (``reward_error``)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import select, text

from service.settings import Settings
from service.store.models import Decision, Group
from service.worker import repository as repo
from service.worker.pipeline import run_once
from tests.conftest import ROOT, start_score_worker
from tests.forked_cli import ForkedProcess
from tests.helpers import make_group
from tests.reward_models.conftest import FakeOpenAIServer


def _groups(api) -> dict[str, Group]:
    with api.factory() as s:
        return {g.id: g for g in s.execute(select(Group)).scalars()}


def test_a_batch_that_died_with_its_worker_gets_its_attempt_back(api, scorer):
    for i in range(3):
        api.post("/v1/groups", json=make_group(f"b-{i}", prompt_id=f"p-{i}", answers=["42", "41"]))
    with api.factory.begin() as s:  # a worker claims all three and dies before writing anything
        assert len(repo.claim_received(s, "dead-worker", 10, 0.05, 10)) == 3
    time.sleep(0.1)
    # the dead claim is split in halves (2 + 1), each claimed together: two passes score all three
    assert [run_once(api.factory, scorer).ready for _ in range(2)] == [2, 1]
    groups = _groups(api)
    assert {g.status for g in groups.values()} == {"ready"}
    # only the attempt that finished counts: the one lost with the worker was given back; no group died alone
    assert {gid: (g.score_attempts, g.score_deaths) for gid, g in groups.items()} == {
        f"b-{i}": (1, 0) for i in range(3)}


def test_a_group_that_dies_claimed_alone_gets_its_attempt_back_and_counts_a_death(api, scorer):
    api.post("/v1/groups", json=make_group("alone", answers=["42", "41"]))
    with api.factory.begin() as s:
        assert repo.claim_received(s, "dead-worker", 10, 0.05, 10)
    time.sleep(0.1)
    with api.factory.begin() as s:
        assert repo.refund_dead_batches(s) == 1
        assert repo.refund_dead_batches(s) == 0  # a dead claim is refunded once
    g = _groups(api)["alone"]
    assert (g.status, g.score_attempts, g.score_deaths, g.retry_at) == ("received", 0, 1, None)
    assert run_once(api.factory, scorer).ready == 1
    assert _groups(api)["alone"].score_attempts == 1


@pytest.mark.parametrize("solo", [0, 1, 3])
def test_a_group_dying_alone_more_than_max_solo_deaths_times_is_the_killer(api, scorer, solo):
    api.post("/v1/groups", json=make_group("killer", prompt_id="pk", answers=["42", "41"]))
    api.post("/v1/groups", json=make_group("fresh", prompt_id="pf", answers=["42", "41"]))
    for n in range(solo + 1):  # each claim of the killer alone dies (the refund of the last one comes below)
        with api.factory.begin() as s:
            assert repo.claim_received(s, f"dead-{n}", 1, 0.05, 10, solo)
        time.sleep(0.1)
    assert _groups(api)["fresh"].score_attempts == 0  # the killer's claims never took its neighbour along
    result = run_once(api.factory, scorer, max_solo_deaths=solo, max_attempts=2)
    groups = _groups(api)
    killer = groups["killer"]
    assert (killer.status, killer.score_deaths, killer.score_attempts) == ("reward_error", solo + 1, 0)
    assert f"died {solo + 1} times while it was scored alone" in killer.score_error
    assert (groups["fresh"].status, groups["fresh"].score_attempts) == ("ready", 1)
    assert result.failed == 1
    with api.factory() as s:
        [reason] = s.scalars(select(Decision.reason).where(Decision.rule == "reward_error"))
    assert f"died {solo + 1} times" in reason and "killer" in reason


def test_an_unrefunded_dead_claim_at_its_last_attempt_is_not_failed_as_exhausted(api, scorer):
    """The attempt a dead claim lost is coming back: ``fail_exhausted`` must not end the group first."""
    api.post("/v1/groups", json=make_group("last", answers=["42", "41"]))
    with api.factory.begin() as s:
        s.execute(text("UPDATE groups SET score_attempts = 2"))
        assert repo.claim_received(s, "dead", 10, 0.05, 3)
    time.sleep(0.1)
    with api.factory.begin() as s:
        assert repo.fail_exhausted(s, 3) == []
    assert run_once(api.factory, scorer, max_attempts=3).ready == 1
    assert _groups(api)["last"].score_attempts == 3


def test_claims_are_short_by_default():
    """A dead worker's groups come back when its claim expires: tens of seconds, not ten minutes."""
    assert Settings().score_claim_seconds <= 60


def test_kill_9_of_a_score_worker_hands_its_groups_to_the_next_one(api, fresh_db):
    """A real worker (default claim) scores a batch of 4 groups against a judge that hangs; it is killed
    with SIGKILL mid-batch; a second worker started at once scores all 4 once the claim expires, and each
    group counts one attempt (the lost one was refunded), with no backoff left on any."""
    judge = FakeOpenAIServer()
    hung = threading.Event()

    def behave(body: dict):
        if not hung.is_set():
            hung.set()
            return ("sleep", 120, "Score: 5")
        return ("answer", "Score: 7" if "fine 1" in json.dumps(body) else "Score: 3")

    judge.default = behave
    threading.Thread(target=judge.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    from reward_models.spec import RewardSpec
    from service.specs import service as specs

    spec = RewardSpec.model_validate({"name": "judged", "components": [
        {"name": "judge", "kind": "judge.llm", "weight": 1.0, "outcome": True,
         "params": {"endpoint": "fake", "model": "fake", "cache_size": 0}}]})
    with api.factory.begin() as s:
        specs.create_reward_spec(s, spec)
    ids = [f"crash-{i}" for i in range(4)]
    for gid in ids:
        g = make_group(gid, prompt_id=f"cp-{gid}", answers=["fine 1", "fine 2"])
        g["prompt"]["reward_spec"] = "judged"
        assert api.post("/v1/groups", json=g).status_code in (200, 201)
    endpoint = {"url": judge.base_url, "max_retries": 0, "timeout_s": 300}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DATABASE_URL": fresh_db, "GRPO_CURATOR_LOG_LEVEL": "warning",
           "GRPO_CURATOR_JUDGE_ENDPOINTS": json.dumps({"fake": endpoint}), "GRPO_CURATOR_WORKER_POLL_SECONDS": "0.2"}
    env.pop("GRPO_CURATOR_SCORE_CLAIM_SECONDS", None)
    def start() -> ForkedProcess:
        return start_score_worker(env, "--processes", "1", "--batch", "8", "--timeout", "300")

    proc = start()
    try:
        assert hung.wait(120), "the worker never called the judge"
        claimed = _groups(api)
        assert {g.claimed_by for g in claimed.values()} != {None}
        until = max(g.claimed_until for g in claimed.values())
        assert (until - datetime.now(UTC)).total_seconds() <= 60  # a short claim, renewed by the heartbeat
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc = start()
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and any(g.status == "received" for g in _groups(api).values()):
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        judge.shutdown()
        judge.server_close()
    final = _groups(api)
    assert {gid: g.status for gid, g in final.items()} == {gid: "ready" for gid in ids}
    assert {gid: (g.score_attempts, g.retry_at) for gid, g in final.items()} == {gid: (1, None) for gid in ids}


# -- issue 26: a real score worker SIGKILLed with its claim -------------------------------------------------
class _KilledWorkers:
    """Score-worker subprocesses against a fake judge ('judged' spec); ``behave(body)`` answers the judge.
    ``kill()`` SIGKILLs the running worker's process group (as an OOM kill or an operator's kill -9 would)."""

    def __init__(self, api, fresh_db: str, behave, **env: str) -> None:
        from reward_models.spec import RewardSpec
        from service.specs import service as specs

        self.api, self.judge = api, FakeOpenAIServer()
        self.judge.default = behave
        threading.Thread(target=self.judge.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        spec = RewardSpec.model_validate({"name": "judged", "components": [
            {"name": "judge", "kind": "judge.llm", "weight": 1.0, "outcome": True,
             "params": {"endpoint": "fake", "model": "fake", "cache_size": 0}}]})
        with api.factory.begin() as s:
            specs.create_reward_spec(s, spec)
        endpoint = {"url": self.judge.base_url, "max_retries": 0, "timeout_s": 300, "api_key_env": "FAKE_JUDGE_KEY"}
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "DATABASE_URL": fresh_db,
                    "GRPO_CURATOR_LOG_LEVEL": "warning", "GRPO_CURATOR_JUDGE_ENDPOINTS": json.dumps({"fake": endpoint}),
                    "GRPO_CURATOR_WORKER_POLL_SECONDS": "0.2", "GRPO_CURATOR_SCORE_CLAIM_SECONDS": "2", **env}
        self.proc: ForkedProcess | None = None
        self.kills = self.generation = 0

    def post(self, gid: str, answers: list[str]) -> None:
        g = make_group(gid, prompt_id=f"kp-{gid}", answers=answers)
        g["prompt"]["reward_spec"] = "judged"
        assert self.api.post("/v1/groups", json=g).status_code in (200, 201)

    def start(self) -> None:
        self.generation += 1  # the judge key names the worker: a call its killed predecessor sent lands late
        env = self.env | {"FAKE_JUDGE_KEY": f"worker-{self.generation}"}
        self.proc = start_score_worker(env, "--processes", "1", "--batch", "8", "--timeout", "300")

    def live_call(self) -> bool:
        """Whether the judge call being answered (inside ``behave``) came from the worker running now, not
        from one already killed whose request reached the judge late (a loaded machine)."""
        headers = {k.lower(): v for k, v in self.judge.local.headers.items()}
        return headers.get("authorization") == f"Bearer worker-{self.generation}"

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None
        self.kills += 1

    def close(self) -> None:
        if self.proc is not None:  # the last worker: stopped, not one of the kills counted
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.judge.shutdown()
        self.judge.server_close()


def _claims_lapsed(api) -> bool:
    """Every claimed group's claim is past, by the clock the claim query reads (clock_timestamp())."""
    with api.factory() as s:
        return s.execute(text("SELECT coalesce(bool_and(claimed_until < clock_timestamp()), false) FROM groups"
                              " WHERE claimed_by IS NOT NULL")).scalar_one()


def _answer(body: dict):
    return ("answer", "Score: 7" if "fine 1" in json.dumps(body) else "Score: 3")  # variance: not dropped


def test_a_dead_batch_of_8_is_scored_in_2_claims_with_its_attempts_unchanged(api, fresh_db):
    """(a) A real worker claims 8 groups in one batch and is SIGKILLed mid-batch (the judge hangs). The dead
    claim is split in two halves of 4: two claim passes score all 8, each with one attempt (the lost one was
    given back), no backoff and no death counted (none of them was alone)."""
    from reward_models.llm_judge import JudgeEndpoint
    from reward_models.scoring import Scorer

    hung = threading.Event()

    def behave(body: dict):
        if not hung.is_set():
            hung.set()
            return ("sleep", 60, "Score: 5")
        return _answer(body)

    w = _KilledWorkers(api, fresh_db, behave)
    ids = [f"b8-{i}" for i in range(8)]
    try:
        for gid in ids:
            w.post(gid, ["fine 1", "fine 2"])
        w.start()
        assert hung.wait(120), "the worker never called the judge"
        claimed = _groups(api)
        assert len({g.claimed_by for g in claimed.values()}) == 1 and None not in {g.claimed_by for g in claimed.values()}
        w.kill()
        deadline = time.monotonic() + 30  # the claim expires (it is no longer renewed), by the database's clock
        while not _claims_lapsed(api) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _claims_lapsed(api), "the dead worker's claim never expired"
        endpoint = JudgeEndpoint(url=w.judge.base_url, max_retries=0, timeout_s=30)
        with Scorer(processes=1, timeout_s=60, judge_endpoints={"fake": endpoint}) as scorer:
            passes = [run_once(api.factory, scorer, batch=8).ready for _ in range(2)]
    finally:
        w.close()
    assert passes == [4, 4]  # halves of the dead batch, each claimed together
    final = _groups(api)
    assert {gid: (g.status, g.score_attempts, g.score_deaths, g.retry_at) for gid, g in final.items()} == {
        gid: ("ready", 1, 0, None) for gid in ids}


def _run_until_final(w: _KilledWorkers, ids: list[str], hit: threading.Event, budget_s: float = 150) -> None:
    """Start a worker; whenever the judge reports the marked call, SIGKILL the worker and start another."""
    w.start()
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline and any(g.status == "received" for g in _groups(w.api).values()):
        if hit.wait(0.2):
            w.kill()
            time.sleep(0.5)  # the dead worker's other judge calls already sent land before the next worker's
            hit.clear()
            w.start()


def test_an_innocent_group_killed_alone_3_times_keeps_its_attempts(api, fresh_db):
    """(b) The only group in the service is being scored when its worker is killed from outside (kill -9),
    three times (the default ``max_solo_deaths``): each death gives the attempt back, so the fourth worker
    scores it with one attempt counted and no backoff; its three deaths are on record."""
    hit = threading.Event()

    def behave(body: dict):
        if w.kills < 3 and w.live_call():
            hit.set()
            return ("sleep", 60, "Score: 5")
        return _answer(body)

    w = _KilledWorkers(api, fresh_db, behave)
    w.env.pop("GRPO_CURATOR_MAX_SOLO_DEATHS", None)
    try:
        w.post("innocent", ["fine 1", "fine 2"])
        _run_until_final(w, ["innocent"], hit)
    finally:
        w.close()
    assert w.kills == 3
    g = _groups(api)["innocent"]
    assert (g.status, g.score_attempts, g.score_deaths, g.retry_at, g.score_error) == ("ready", 1, 3, None, None)


def test_a_poison_group_ends_reward_error_and_its_neighbours_keep_their_attempts(api, fresh_db):
    """(c) A group whose judge call kills the worker (here: the judge hangs on it and the worker is
    SIGKILLed, as the OOM killer would) is claimed with 3 good neighbours. The dead batch is bisected
    (4 -> 2 -> 1), the poison alone dies past ``max_solo_deaths`` (1 here) and ends ``reward_error`` with
    a decision naming it the killer; every neighbour is scored with one attempt and no backoff."""
    hit = threading.Event()

    def behave(body: dict):
        if "POISON" in json.dumps(body) and w.live_call():
            hit.set()
            return ("sleep", 60, "Score: 5")
        return _answer(body)

    w = _KilledWorkers(api, fresh_db, behave, GRPO_CURATOR_MAX_SOLO_DEATHS="1")
    ids = ["poison", "good-a", "good-b", "good-c"]  # the poison first: the lowest pk
    try:
        for gid in ids:
            w.post(gid, ["POISON 1", "POISON 2"] if gid == "poison" else ["fine 1", "fine 2"])
        _run_until_final(w, ids, hit)
    finally:
        w.close()
    final = _groups(api)
    poison = final.pop("poison")
    assert (poison.status, poison.score_deaths, poison.score_attempts) == ("reward_error", 2, 0)
    assert "died 2 times while it was scored alone" in poison.score_error
    assert {gid: (g.status, g.score_attempts, g.score_deaths, g.retry_at) for gid, g in final.items()} == {
        gid: ("ready", 1, 0, None) for gid in ids[1:]}
    assert w.kills == 4  # the batch of 4, the half of 2, the poison alone twice
    with api.factory() as s:
        [reason] = s.scalars(select(Decision.reason).where(Decision.rule == "reward_error"))
    assert "likely killer" in reason


# -- a frozen worker, a live worker's lapse, the database's clock, the timing settings (issue 26 follow-up) ---
def test_a_worker_frozen_inside_the_refund_blocks_recovery_only_until_the_server_ends_it(api, scorer, fresh_db):
    """A worker frozen (SIGSTOP, a VM pause, a partition) inside its refund transaction holds the refund
    lock; its connection's ``idle_in_transaction_session_timeout`` (worker_idle_in_transaction_s) ends that
    transaction server-side, and the dead claims are claimable again."""
    from sqlalchemy.exc import DBAPIError

    from service.store.db import make_sessionmaker, worker_engine

    for i in range(2):
        api.post("/v1/groups", json=make_group(f"d-{i}", prompt_id=f"p-{i}", answers=["42", "41"]))
    with api.factory.begin() as s:
        assert len(repo.claim_received(s, "dead-worker", 10, 0.05, 10)) == 2
    time.sleep(0.1)
    bounded = make_sessionmaker(worker_engine(fresh_db, Settings(worker_idle_in_transaction_s=1,
                                                                 worker_lock_timeout_s=1)))
    frozen = bounded()
    frozen.begin()
    assert frozen.execute(text("SELECT pg_try_advisory_xact_lock(26026)")).scalar()  # ... and froze here
    with api.factory.begin() as s:
        assert repo.refund_dead_batches(s) == 0  # while it holds the lock nobody refunds
    assert {g.claimed_by for g in _groups(api).values()} == {"dead-worker"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(g.status != "ready" for g in _groups(api).values()):
        run_once(bounded, scorer)
        time.sleep(0.2)
    groups = _groups(api)
    assert {gid: (g.status, g.score_attempts, g.score_deaths) for gid, g in groups.items()} == {
        "d-0": ("ready", 1, 0), "d-1": ("ready", 1, 0)}
    with pytest.raises(DBAPIError, match="idle-in-transaction"):  # the server ended the frozen worker's transaction
        frozen.execute(text("SELECT 1"))
    frozen.close()


def test_worker_connections_carry_the_transaction_bounds(fresh_db):
    from service.store.db import worker_engine

    engine = worker_engine(fresh_db, Settings(worker_idle_in_transaction_s=7, worker_lock_timeout_s=3))
    with engine.connect() as conn:
        assert conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar() == "7s"
        assert conn.execute(text("SHOW lock_timeout")).scalar() == "3s"


def _lapse(api, scorer, token: str, solo: int = 3):
    """A live worker claims the group alone, scores it, and its heartbeat lapses past the claim (a DB
    failover, a pause): another worker refunds the claim as dead before the live one writes back."""
    from service.scoring import service as scoring
    from service.worker.pipeline import PipelineConfig

    with api.factory.begin() as s:
        repo.refund_dead_batches(s)
    with api.factory.begin() as s:
        pks = repo.claim_received(s, token, 1, 0.05, 10, solo, refund=False)
    assert pks
    with api.factory() as s:
        job = scoring.prepare(s, token, pks, frozenset())
    scoring.score_job(scorer, job)
    time.sleep(0.1)
    with api.factory.begin() as s:  # the other worker takes the lapsed claim for dead
        assert repo.refund_dead_batches(s) == 1
    return job, PipelineConfig(max_solo_deaths=solo)


def test_a_live_worker_whose_claim_lapsed_takes_the_death_back(api, scorer):
    from service.worker.pipeline import write_back

    api.post("/v1/groups", json=make_group("inno", answers=["42", "41"]))
    for n in range(4):  # 4 lapses > max_solo_deaths = 3: each live worker comes back and is fenced
        job, cfg = _lapse(api, scorer, f"live-{n}")
        assert _groups(api)["inno"].score_deaths == 1
        out, _ = write_back(api.factory, job, cfg)
        assert out.fenced == 1
        g = _groups(api)["inno"]
        assert (g.status, g.score_deaths, g.death_tokens) == ("received", 0, [])
    run_once(api.factory, scorer, max_solo_deaths=3)
    g = _groups(api)["inno"]
    assert (g.status, g.score_deaths, g.score_error) == ("ready", 0, None)


def test_a_group_ended_as_killer_by_live_lapses_is_scored_again_when_a_worker_comes_back(api, scorer):
    from service.worker.pipeline import write_back

    api.post("/v1/groups", json=make_group("inno", answers=["42", "41"]))
    jobs = [_lapse(api, scorer, f"live-{n}", solo=1) for n in range(2)]  # nobody has come back yet
    with api.factory.begin() as s:
        assert repo.fail_killers(s, 1) == [(_groups(api)["inno"].pk, 2)]
    assert _groups(api)["inno"].status == "reward_error"
    job, cfg = jobs[0]
    write_back(api.factory, job, cfg)  # one of them lives: 1 death left, within max_solo_deaths
    g = _groups(api)["inno"]
    assert (g.status, g.score_deaths, g.death_tokens, g.score_error) == ("received", 1, ["live-1"], None)
    run_once(api.factory, scorer, max_solo_deaths=1)
    assert _groups(api)["inno"].status == "ready"


def test_a_really_killed_worker_still_counts_its_death(api, scorer):
    """The take-back is keyed by the dead claim's token: another live worker's write takes nothing back."""
    from service.worker.pipeline import write_back

    api.post("/v1/groups", json=make_group("k", answers=["42", "41"]))
    _lapse(api, scorer, "killed")  # never comes back
    job, cfg = _lapse(api, scorer, "live")
    write_back(api.factory, job, cfg)
    g = _groups(api)["k"]
    assert (g.score_deaths, g.death_tokens) == (1, ["killed"])


def test_retry_backoff_is_taken_from_the_database_clock(api, scorer):
    """A worker whose clock is 2 h behind the database's still waits the backoff before the retry."""
    from datetime import timedelta
    from unittest import mock

    import service.scoring.stage as stage
    from reward_models.spec import RewardSpec
    from service.specs import service as specs

    spec = RewardSpec.model_validate({"name": "broken", "components": [
        {"name": "j", "kind": "judge.llm", "weight": 1.0, "outcome": True,
         "params": {"endpoint": "nowhere", "model": "m", "cache_size": 0}}]})
    with api.factory.begin() as s:
        specs.create_reward_spec(s, spec)
    g = make_group("skew", answers=["a", "b"])
    g["prompt"]["reward_spec"] = "broken"
    assert api.post("/v1/groups", json=g).status_code < 300
    real = datetime

    class Skewed(real):
        @classmethod
        def now(cls, tz=None):  # noqa: ANN001, ANN206
            return real.now(tz) - timedelta(hours=2)

    with mock.patch.object(stage, "datetime", Skewed):
        retried = [run_once(api.factory, scorer, backoff_base_s=60, max_attempts=5).retried for _ in range(4)]
    assert retried == [1, 0, 0, 0]
    with api.factory() as s:
        attempts, status, wait = s.execute(text(
            "SELECT score_attempts, status, extract(epoch FROM retry_at - clock_timestamp())"
            " FROM groups WHERE id = 'skew'")).one()
    assert (attempts, status) == (1, "received") and wait > 0


@pytest.mark.parametrize("value", [0, -5, float("inf"), float("nan"), 0.1])
def test_a_claim_that_cannot_hold_is_refused_naming_the_setting(value):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="score_claim_seconds"):
        Settings(score_claim_seconds=value)


@pytest.mark.parametrize("name", ["worker_poll_seconds", "score_backoff_base_s", "score_backoff_max_s",
                                  "component_timeout_s", "worker_idle_in_transaction_s", "worker_lock_timeout_s"])
@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan")])
def test_worker_timings_are_finite_and_positive(name, value):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=name):
        Settings(**{name: value})


def test_a_pipeline_config_refuses_a_claim_that_cannot_hold():
    from service.worker.pipeline import PipelineConfig

    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="claim_seconds"):
            PipelineConfig(claim_seconds=bad)
