"""One scoring request's share of the shared process pool (reward_models.scoring.PoolBudget, setting
``score_pool_budget_s`` / ``score_pool_max_in_flight``): it cannot queue its whole batch ahead of the worker,
and past its budget it stops (its queued tasks cancelled) and /v1/score answers 413.

Real parts: the Scorer's killable pool running a user's python.function (it logs the order tasks run in),
and the app over a real PostgreSQL.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from reward_models.base import PromptInfo, Sample
from reward_models.external import PYTHON_FUNCTIONS_ENV
from reward_models.scoring import PoolBudget, PoolBudgetExceeded, Scorer
from reward_models.spec import RewardSpec
from tests.helpers import restart_forkserver

SLOW = '''
import time

def slow(data_source, solution_str, ground_truth, extra_info=None):
    with open(extra_info["log"], "a") as f:
        f.write(solution_str + "\\n")
    time.sleep(0 if solution_str.startswith("fast") else float(extra_info["sleep"]))
    return 1.0
'''


@pytest.fixture
def slow_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[RewardSpec, Path]:
    """A spec whose one component logs each task as it starts, then sleeps 0.4 s (0 for a "fast..." answer);
    pool processes started after this see the allowlist."""
    path, log = tmp_path / "slow.py", tmp_path / "order.log"
    path.write_text(SLOW)
    monkeypatch.setenv(PYTHON_FUNCTIONS_ENV, json.dumps({"slow": f"{path}:slow"}))
    restart_forkserver()
    spec = RewardSpec.model_validate({"name": "slow", "components": [
        {"name": "slow", "kind": "python.function",
         "params": {"name": "slow", "extra_info": {"log": str(log), "sleep": 0.4}}}]})
    return spec, log


def _items(*names: str) -> list[tuple[Sample, PromptInfo]]:
    return [(Sample(messages=[{"role": "assistant", "content": n}], final_answer=n, finish_reason="stop",
                    num_tokens=1, num_turns=1),
             PromptInfo(messages=[{"role": "user", "content": "p"}], reference={}, metadata={}, dataset="d"))
            for n in names]


def _order(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def _wait_for(log: Path, name: str) -> None:
    for _ in range(3000):
        if name in _order(log):
            return
        time.sleep(0.01)
    raise AssertionError(f"{name} never started: {_order(log)}")


@pytest.mark.parametrize("budget", [PoolBudget(60, max_in_flight=1), None])
def test_a_budgeted_request_does_not_queue_its_batch_ahead_of_the_worker(slow_spec, budget) -> None:
    spec, log = slow_spec
    request = _items("req-0", "req-1", "req-2", "req-3")
    with Scorer(processes=1, timeout_s=30) as scorer:
        done: list = []
        t = threading.Thread(target=lambda: done.append(scorer.score(spec, request, budget)))
        t.start()
        _wait_for(log, "req-0")
        [worker] = scorer.score(spec, _items("worker"))  # the background worker's task, while req-0 runs
        t.join()
    assert worker.total == 1.0 and [s.total for s in done[0]] == [1.0] * 4
    if budget is not None:  # one request task at a time: the worker's runs next
        assert _order(log) == ["req-0", "worker", "req-1", "req-2", "req-3"]
    else:  # unbounded (what the worker itself uses): the whole batch was queued first
        assert _order(log) == ["req-0", "req-1", "req-2", "req-3", "worker"]


def test_past_its_budget_a_request_stops_and_its_queued_tasks_never_run(slow_spec) -> None:
    spec, log = slow_spec
    with Scorer(processes=1, timeout_s=30) as scorer:
        scorer.score(spec, _items("fast-warm"))  # the pool's start-up is not what this test measures
        with pytest.raises(PoolBudgetExceeded, match=r"of 4 pool tasks finished within the budget of 0.6 s"):
            scorer.score(spec, _items("req-0", "req-1", "req-2", "req-3"), PoolBudget(0.6, max_in_flight=1))
        [after] = scorer.score(spec, _items("after"))  # the pool still serves the next caller
    assert after.total == 1.0
    # req-1 had started (a running task ends by its own deadline); req-2 and req-3 were never run
    assert _order(log) == ["fast-warm", "req-0", "req-1", "after"]


@pytest.mark.parametrize(("seconds", "in_flight"), [(0, None), (-1, 2), (5, 0)])
def test_pool_budget_rejects_nonsense(seconds: float, in_flight: int | None) -> None:
    with pytest.raises(ValueError, match="PoolBudget"):
        PoolBudget(seconds, in_flight)


@pytest.fixture
def budget_client(make_db, slow_spec, request: pytest.FixtureRequest) -> Iterator[tuple[TestClient, str]]:
    """The app with one pool process, one request task at a time and a pool budget (default 0.6 s)."""
    from service.app import create_app
    from service.settings import Settings

    url = make_db()
    budget = getattr(request, "param", 0.6)
    settings = Settings(database_url=url, score_pool_budget_s=budget, score_pool_max_in_flight=1,
                        component_timeout_s=30, worker_processes=1)
    with TestClient(create_app(settings)) as c:
        spec, _ = slow_spec
        assert c.post("/v1/reward-specs", json=spec.model_dump()).status_code == 201
        yield c, url


def test_score_past_the_pool_budget_is_413_naming_it_and_stores_nothing(budget_client) -> None:
    from sqlalchemy import func, select

    from service.store.db import get_engine, make_sessionmaker
    from service.store.models import Group

    budget_client, url = budget_client
    items = [{"prompt": "p", "completion": f"req-{i}"} for i in range(4)]
    r = budget_client.post("/v1/score", json={"reward_spec": "slow", "items": items, "store": True})
    assert r.status_code == 413, r.text
    body = r.json()
    assert body["error"].startswith("items: ") and "score_pool_budget_s" in body["error"]
    assert body["detail"] == {"max_items": 512, "pool_budget_s": 0.6}
    with make_sessionmaker(get_engine(url))() as session:
        assert session.scalar(select(func.count()).select_from(Group)) == 0
    time.sleep(0.5)  # slack for req-1, still running to its own end (not an assertion on time)
    one = budget_client.post("/v1/score", json={"reward_spec": "slow", "items": [{"prompt": "p", "completion": "fast"}]})
    assert one.status_code == 200 and one.json()["results"][0]["total"] == 1.0


@pytest.mark.parametrize("budget_client", [1.5], indirect=True)
def test_the_adapters_client_splits_a_request_answered_413_for_its_pool_budget(budget_client) -> None:
    from grpo_curator_integrations._http import Client, Target

    c, _ = budget_client
    client = Client(Target("http://testserver", "slow", None))
    client._http = c  # the adapters' HTTP path, over the app in this process
    items = [{"prompt": "p", "completion": f"req-{i}"} for i in range(8)]
    # 8 x 0.4 s, one at a time, then 4 x 0.4 s: past 1.5 s -> 413 -> half; 2 items (0.8 s) fit
    results = client.score(items)
    assert [r["total"] for r in results] == [1.0] * 8
    assert client.chunk in (1, 2)  # 1 only when a task of a refused chunk was still running
