"""Slow scores and slow clients hold no database connection, /healthz never queues behind them, and serve
stops on SIGTERM with them open; a key in an OpenRLHF path reaches no response body and no log line.

Real servers (``serve`` in a subprocess) on a 2-connection pool with no overflow: before the fix, 3 slow
/v1/score requests or 3 exports a client stopped reading kept the pool's connections "idle in transaction"
and /healthz waited for a connection (then 503), and serve never finished its shutdown.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from service.client import wait_healthy
from tests.conftest import ROOT, free_port, start_server, stop_server
from tests.helpers import make_group

POOL = {"GRPO_CURATOR_DB_POOL_SIZE": "2", "GRPO_CURATOR_DB_MAX_OVERFLOW": "0"}
IDLE_IN_TX = text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                  "AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'")
GATE = '''
import os, time, uuid
from pathlib import Path

def compute_score(data_source, solution_str, ground_truth, extra_info):
    here = Path(__file__).parent
    (here / "started" / uuid.uuid4().hex).touch()
    deadline = time.monotonic() + 120
    while not (here / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return 1.0
'''


def idle_in_transaction(db_url: str) -> int:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return conn.execute(IDLE_IN_TX).scalar_one()
    finally:
        engine.dispose()


def eventually(pred: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Liveness: ``pred`` holds within ``timeout_s`` (polled)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    (tmp_path / "started").mkdir()
    (tmp_path / "gate.py").write_text(GATE)
    return tmp_path


def test_slow_scores_hold_no_connection_and_healthz_and_ingest_answer(fresh_db: str, gate: Path) -> None:
    env = {**POOL, "GRPO_CURATOR_PYTHON_FUNCTIONS": json.dumps({"gate": str(gate / "gate.py")}),
           "GRPO_CURATOR_COMPONENT_TIMEOUT_S": "150"}
    server = start_server(fresh_db, env=env)
    results: list[httpx.Response] = []
    try:
        with httpx.Client(base_url=server.url, timeout=200) as http:
            spec = {"name": "slow", "components": [{"name": "g", "kind": "python.function",
                                                     "params": {"name": "gate"}}]}
            assert http.post("/v1/reward-specs", json=spec).status_code == 201
            body = {"reward_spec": "slow", "items": [{"prompt": "q", "completion": "a"}]}

            def score() -> None:
                with httpx.Client(base_url=server.url, timeout=200) as own:
                    results.append(own.post("/v1/score", json=body))

            threads = [threading.Thread(target=score) for _ in range(4)]  # more than the pool's 2 connections
            for t in threads:
                t.start()
            assert eventually(lambda: any((gate / "started").iterdir()))  # a slow score is running
            assert not results  # all four still in flight
            assert idle_in_transaction(server.db_url) == 0
            assert http.get("/healthz", timeout=20).json()["status"] == "ok"
            assert http.get("/readyz", timeout=20).status_code == 200
            assert http.post("/v1/groups", json=make_group("during", n=2), timeout=20).status_code == 201
            assert not results  # they answered while the slow scores were still in flight
            (gate / "release").touch()
            for t in threads:
                t.join(timeout=200)
        assert [r.status_code for r in results] == [200] * 4
        assert all(r.json()["results"][0]["total"] == 1.0 for r in results)
    finally:
        (gate / "release").touch()
        stop_server(server)


FILL = [
    """INSERT INTO prompts (id, dataset, messages, reference, metadata)
       VALUES ('p', 'big', '[{"role": "user", "content": "q"}]', '{"answer": "42"}', '{}')""",
    """INSERT INTO groups (id, prompt_id, dataset, policy_version, sampling, metadata, body_hash, status,
                          n_trajectories, n_tokens, reward_spec_name, reward_spec_version)
       SELECT 'g' || i, 'p', 'big', 0, '{}', '{}', md5(i::text), 'ready', 4, 0, 'x', 1
       FROM generate_series(1, 3000) i""",
    """INSERT INTO trajectories (group_pk, idx, messages, final_answer, seq_len, num_tokens, num_turns,
                                finish_reason, metadata, total_reward, outcome, advantage, action)
       SELECT g.pk, j, jsonb_build_array(jsonb_build_object('role', 'assistant',
                                                            'content', md5(g.pk::text) || repeat('x', 2000))),
              'a', 0, 10, 1, 'stop', '{}', j::float, (j % 2)::float, j - 1.5, 'keep'
       FROM groups g, generate_series(0, 3) j""",
]


def fill(db_url: str) -> None:
    engine = create_engine(db_url)
    with engine.begin() as conn:
        for stmt in FILL:
            conn.execute(text(stmt))
    engine.dispose()


def stuck_export(url: str) -> socket.socket:
    """An export whose client reads its first bytes, then never reads again (the socket stays open)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(f"GET /v1/export?format=rollouts&dataset=big HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    assert sock.recv(64).startswith(b"HTTP/1.1 200")
    return sock


@pytest.fixture
def filled_db(fresh_db: str) -> Iterator[str]:
    fill(fresh_db)
    yield fresh_db


def test_exports_a_client_stopped_reading_hold_no_transaction(filled_db: str) -> None:
    server = start_server(filled_db, env=POOL)
    try:
        socks = [stuck_export(server.url) for _ in range(4)]  # more than the pool's 2 connections
        # the server fills the sockets and waits on the clients: no transaction stays open meanwhile
        assert eventually(lambda: idle_in_transaction(server.db_url) == 0)
        with httpx.Client(base_url=server.url, timeout=20) as http:
            assert http.get("/healthz").status_code == 200
            assert http.get("/readyz").status_code == 200
            assert http.post("/v1/groups", json=make_group("during", n=2)).status_code == 201
        for s in socks:
            s.close()
        assert eventually(lambda: idle_in_transaction(server.db_url) == 0)
        with httpx.Client(base_url=server.url, timeout=60) as http:
            lines = http.get("/v1/export", params={"format": "rollouts", "dataset": "big"}).text.splitlines()
        assert len(lines) == 12_000  # a whole export still reads every row, across pages
    finally:
        stop_server(server)


def test_serve_stops_on_sigterm_with_stuck_exports_and_long_polls_open(filled_db: str) -> None:
    server = start_server(filled_db, env={**POOL, "GRPO_CURATOR_SHUTDOWN_TIMEOUT_S": "2"})
    socks = []
    try:
        socks = [stuck_export(server.url) for _ in range(3)]
        poll = threading.Thread(target=lambda: _long_poll(server.url), daemon=True)
        poll.start()
        time.sleep(0.5)  # not a threshold: gives the poll time to reach the server before the signal
        server.proc.send_signal(signal.SIGTERM)
        try:
            code = server.proc.wait(timeout=60)  # liveness: the configured timeout is 2 s
        except subprocess.TimeoutExpired:
            server.proc.kill()
            pytest.fail("serve did not exit after SIGTERM with stuck exports and a long poll open")
        assert code is not None
    finally:
        for s in socks:
            s.close()
        stop_server(server)


def _long_poll(url: str) -> None:
    body = {"trainer_id": "t", "max_groups": 1, "wait_seconds": 120, "dataset": "none"}
    try:
        httpx.post(f"{url}/v1/batches/lease", json=body, timeout=200)
    except httpx.HTTPError:
        pass


def test_a_key_in_an_openrlhf_path_reaches_no_body_and_no_log_line(fresh_db: str, tmp_path: Path) -> None:
    token = "gck_" + "a" * 32 + "_SECRETpart-of-the-key"
    log = tmp_path / "serve.log"
    port = free_port()
    env = {**os.environ, "DATABASE_URL": fresh_db, "GRPO_CURATOR_EMBEDDED_WORKER": "false",
           "GRPO_CURATOR_LOG_LEVEL": "info"}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
                                env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    bodies = []
    try:
        wait_healthy(url, proc, timeout_s=60)
        shapes = [f"/compat/openrlhf/key/{token}", f"/compat/openrlhf/key/{token}/",
                  f"/compat/openrlhf/key/{token}/spec", f"/compat/openrlhf/key/{token}/spec/get_reward",
                  f"/compat/openrlhf/key/{token}/a/b/get_reward", f"/compat/openrlhf/%6Bey/{token}",
                  f"/compat/openrlhf/key/{token}?x=1"]
        with httpx.Client(base_url=url, timeout=20) as http:
            for shape in shapes:
                for method in ("GET", "POST", "PUT"):
                    r = http.request(method, shape, json={"query": ["x"], "prompts": ["x"]})
                    assert r.status_code in (401, 404, 405, 422), (shape, method, r.status_code)
                    bodies.append(r.text + json.dumps(dict(r.headers)))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    logged = log.read_text()
    assert "/compat/openrlhf/key/redacted" in logged  # the access log saw these requests, masked
    for text_ in [*bodies, logged]:
        assert "SECRETpart" not in text_ and "a" * 32 not in text_


def test_healthz_answers_and_readyz_says_not_ready_while_the_pool_is_exhausted(fresh_db: str, monkeypatch) -> None:
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings, get_settings
    from service.store.db import dispose_engine, get_engine

    monkeypatch.setenv("GRPO_CURATOR_DB_POOL_SIZE", "2")
    monkeypatch.setenv("GRPO_CURATOR_DB_MAX_OVERFLOW", "0")
    get_settings.cache_clear()
    dispose_engine(fresh_db)
    try:
        app = create_app(Settings(database_url=fresh_db, readyz_timeout_s=1), database_url=fresh_db)
        engine = get_engine(fresh_db)
        with TestClient(app) as c:
            assert c.get("/readyz").status_code == 200
            held = [engine.connect() for _ in range(2)]  # every pooled connection is taken
            try:
                r = c.get("/healthz")
                assert r.status_code == 200 and r.json()["status"] == "ok", r.text
                r = c.get("/readyz")
                assert r.status_code == 503 and r.json()["error"].startswith("database: unavailable"), r.text
            finally:
                for conn in held:
                    conn.close()
            assert c.get("/readyz").status_code == 200
    finally:
        get_settings.cache_clear()
        dispose_engine(fresh_db)
