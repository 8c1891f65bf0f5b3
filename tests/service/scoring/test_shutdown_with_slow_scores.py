"""serve stops within its shutdown timeout while /v1/score requests wait on a slow judge.

Attack (round 2, /tmp/attack-svc/f_sigterm.py): 5 /v1/score requests against a judge that answers after
90 s, GRPO_CURATOR_SHUTDOWN_TIMEOUT_S=10: serve took ~86 s to exit after SIGTERM, because the score
threads (a ThreadPoolExecutor's) are joined at interpreter exit. They are daemon threads now: the scores
in flight are abandoned and their clients' connections closed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import start_server, stop_server
from tests.reward_models.conftest import FakeOpenAIServer
from tests.service.api.test_slow_clients_and_scores import eventually

JUDGE_DELAY_S = 300  # the fake judge answers long after any bound this test waits


@pytest.fixture
def slow_judge() -> Iterator[FakeOpenAIServer]:
    """A fake of an outside LLM judge (OpenAI chat-completions wire format) that answers very late."""
    server = FakeOpenAIServer()
    server.default = ("sleep", JUDGE_DELAY_S, "Score: 10")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_sigterm_with_slow_scores_in_flight_exits_within_the_shutdown_timeout(fresh_db: str,
                                                                              slow_judge: FakeOpenAIServer) -> None:
    endpoints = {"slow": {"url": slow_judge.base_url, "timeout_s": JUDGE_DELAY_S, "max_retries": 0}}
    env = {"GRPO_CURATOR_JUDGE_ENDPOINTS": json.dumps(endpoints), "GRPO_CURATOR_SHUTDOWN_TIMEOUT_S": "2",
           "GRPO_CURATOR_EMBEDDED_WORKER": "true"}
    server = start_server(fresh_db, env=env)
    outcomes: list[object] = []
    try:
        spec = {"name": "slow", "components": [{"name": "j", "kind": "judge.llm", "weight": 1.0, "params": {
            "endpoint": "slow", "model": "m", "rubric": "rate {response}"}}]}
        assert httpx.post(f"{server.url}/v1/reward-specs", json=spec, timeout=20).status_code == 201

        def score(i: int) -> None:
            body = {"reward_spec": "slow", "items": [{"prompt": "q", "completion": f"a{i}"}]}
            try:
                outcomes.append(httpx.post(f"{server.url}/v1/score", json=body, timeout=JUDGE_DELAY_S).status_code)
            except httpx.HTTPError as exc:
                outcomes.append(type(exc).__name__)

        clients = [threading.Thread(target=score, args=(i,), daemon=True) for i in range(5)]
        for t in clients:
            t.start()
        assert eventually(lambda: len(slow_judge.requests) == 5)  # every score waits on the judge
        server.proc.send_signal(signal.SIGTERM)
        try:
            # a bounded wait far below the judge's delay: the timeout is 2 s, the judge answers after 300 s
            server.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("serve did not exit after SIGTERM while scores waited on a slow judge")
        for t in clients:
            t.join(timeout=30)
        assert len(outcomes) == 5 and 200 not in outcomes, outcomes  # abandoned: no client got a score
    finally:
        stop_server(server)
