"""A score worker that dies (kill -9, OOM) hands its groups back within one short claim, and the attempt its
batch lost is not the groups' failure: it neither counts toward ``max_attempts`` nor grows their backoff.
A group that dies while claimed alone still pays (a group that kills its worker runs out of attempts)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

from sqlalchemy import select

from service.settings import Settings
from service.store.models import Group
from service.worker import repository as repo
from service.worker.pipeline import run_once
from tests.conftest import ROOT
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
    for _ in range(4):  # each is re-claimed alone (the killer, if any, is isolated) and scored
        run_once(api.factory, scorer)
    groups = _groups(api)
    assert {g.status for g in groups.values()} == {"ready"}
    # only the attempt that finished counts: the one lost with the worker was given back
    assert {gid: g.score_attempts for gid, g in groups.items()} == {f"b-{i}": 1 for i in range(3)}


def test_a_group_that_dies_claimed_alone_still_counts_its_attempt(api, scorer):
    api.post("/v1/groups", json=make_group("alone"))
    with api.factory.begin() as s:
        assert repo.claim_received(s, "dead-worker", 10, 0.05, 10)
    time.sleep(0.1)
    with api.factory.begin() as s:
        assert repo.refund_dead_batches(s) == 0  # a claim of one group: it is the only suspect
    assert _groups(api)["alone"].score_attempts == 1


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
    cmd = [sys.executable, "-m", "service.cli", "score-worker", "--processes", "1", "--batch", "8",
           "--timeout", "300"]

    def start() -> subprocess.Popen:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)

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
