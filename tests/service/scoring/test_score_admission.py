"""Scoring requests take bounded shares: pool slots across all /v1/score requests, and requests per key.

Attack (round 2): /v1/score requests could fill the shared process pool's queue ahead of the worker's tasks
(each request had its own window of pool tasks, with no cap across requests), and one key could hold every
scoring thread. Now ``score_pool_slots`` caps the pool tasks of all scoring requests together (the rest wait,
holding no thread), and ``score_max_in_flight_per_key`` answers 429 with Retry-After beyond a key's share.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from service.auth.keys import provision
from service.scoring.gate import ScoreGate, TooManyScoring
from tests.conftest import start_server, stop_server
from tests.helpers import bearer
from tests.service.api.test_slow_clients_and_scores import GATE, eventually


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    (tmp_path / "started").mkdir()
    (tmp_path / "gate.py").write_text(GATE)
    return tmp_path


def _serve(fresh_db: str, gate: Path, **env: str):
    tokens = provision(fresh_db, {"admin": "admin", "a": "trainer", "b": "trainer", "c": "producer"})
    server = start_server(fresh_db, env={"GRPO_CURATOR_PYTHON_FUNCTIONS": json.dumps({"gate": str(gate / "gate.py")}),
                                         "GRPO_CURATOR_COMPONENT_TIMEOUT_S": "150", **env})
    spec = {"name": "slow", "components": [{"name": "g", "kind": "python.function", "params": {"name": "gate"}}]}
    plain = {"name": "plain", "components": [{"name": "em", "kind": "verifier.exact_match", "outcome": True}]}
    for s in (spec, plain):
        assert httpx.post(f"{server.url}/v1/reward-specs", json=s, headers=bearer(tokens["admin"])).status_code == 201
    return server, tokens


def _score_async(url: str, token: str, out: list, spec: str = "slow") -> threading.Thread:
    def run() -> None:
        body = {"reward_spec": spec, "items": [{"prompt": "q", "completion": "a", "reference": {"answer": "a"}}]}
        out.append(httpx.post(f"{url}/v1/score", json=body, headers=bearer(token), timeout=200))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_key_beyond_its_in_flight_limit_gets_429_with_retry_after(fresh_db: str, gate: Path) -> None:
    server, tokens = _serve(fresh_db, gate, GRPO_CURATOR_SCORE_MAX_IN_FLIGHT_PER_KEY="2")
    results: list[httpx.Response] = []
    try:
        threads = [_score_async(server.url, tokens["a"], results) for _ in range(2)]
        assert eventually(lambda: any((gate / "started").iterdir()))  # one scores, the other is admitted too
        body = {"reward_spec": "slow", "items": [{"prompt": "q", "completion": "a"}]}
        r = httpx.post(f"{server.url}/v1/score", json=body, headers=bearer(tokens["a"]), timeout=30)
        assert r.status_code == 429, r.text
        assert "score_max_in_flight_per_key=2" in r.json()["error"] and int(r.headers["Retry-After"]) >= 1
        assert r.json()["detail"]["limit"] == 2
        threads.append(_score_async(server.url, tokens["b"], results))  # another key is admitted meanwhile
        assert not results
        (gate / "release").touch()
        for t in threads:
            t.join(timeout=200)
        assert [x.status_code for x in results] == [200, 200, 200]
        again = httpx.post(f"{server.url}/v1/score", json=body, headers=bearer(tokens["a"]), timeout=60)
        assert again.status_code == 200  # the key's share came back when its scores ended
    finally:
        (gate / "release").touch()
        stop_server(server)


def test_scoring_requests_together_take_at_most_score_pool_slots_of_the_pool(fresh_db: str, gate: Path) -> None:
    # a pool of 2 processes, but /v1/score may hold only 1 of its slots: the second request waits its turn
    server, tokens = _serve(fresh_db, gate, GRPO_CURATOR_WORKER_PROCESSES="2", GRPO_CURATOR_SCORE_POOL_SLOTS="1")
    results: list[httpx.Response] = []
    try:
        threads = [_score_async(server.url, tokens["a"], results)]
        assert eventually(lambda: len(list((gate / "started").iterdir())) == 1)
        threads.append(_score_async(server.url, tokens["b"], results))
        # a spec that needs no pool is not held up by the wait for slots
        plain = []
        _score_async(server.url, tokens["c"], plain, spec="plain").join(timeout=60)
        assert plain and plain[0].status_code == 200 and plain[0].json()["results"][0]["total"] == 1.0
        time.sleep(1.0)  # not a threshold: gives a second pool task the chance to start if the cap were absent
        assert len(list((gate / "started").iterdir())) == 1 and not results
        (gate / "release").touch()
        for t in threads:
            t.join(timeout=200)
        assert [x.status_code for x in results] == [200, 200]
        assert len(list((gate / "started").iterdir())) == 2  # the second ran once the first gave its slot back
    finally:
        (gate / "release").touch()
        stop_server(server)


def test_the_gate_serves_slot_waiters_in_order_and_a_cancelled_waiter_gives_nothing_away() -> None:
    async def scenario() -> list[str]:
        g = ScoreGate(pool_slots=2, per_key=1)
        order: list[str] = []
        await g.take_slots(2)

        async def want(name: str, n: int) -> None:
            await g.take_slots(n)
            order.append(name)

        big, cancelled, small = (asyncio.create_task(want("big", 2)), asyncio.create_task(want("x", 1)),
                                 asyncio.create_task(want("small", 1)))
        await asyncio.sleep(0)
        cancelled.cancel()
        g.give_slots(2)
        await big
        g.give_slots(2)
        await small
        assert g._free == 1  # noqa: SLF001 - small holds 1 of 2; the cancelled waiter holds none
        g.enter_key("k")
        with pytest.raises(TooManyScoring):
            g.enter_key("k")
        g.leave_key("k")
        g.enter_key("k")
        return order

    assert asyncio.run(scenario()) == ["big", "small"]
