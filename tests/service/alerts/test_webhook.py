"""The webhook outbox: every transition stored pending and posted by the worker as Slack-compatible JSON with
an idempotency key, retried with backoff, never on a request's path, surviving a kill -9. The receiver is a
fake (we cannot run Slack here) speaking plain HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.conftest import start_server, stop_server
from tests.service.alerts.helpers import group


class FakeSlackWebhook:
    """A fake incoming-webhook endpoint: answers 500 to the first ``failures`` requests and 200 ("ok", as
    Slack does) after; records every accepted JSON body with its ``Idempotency-Key`` header."""

    def __init__(self, failures: int) -> None:
        self.failures, self.requests, self.accepted = failures, 0, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests += 1
                ok = fake.requests > fake.failures
                if ok:
                    fake.accepted.append((self.headers.get("Idempotency-Key"), body))
                self.send_response(200 if ok else 500)
                self.end_headers()
                self.wfile.write(b"ok" if ok else b"error")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T0/B0/x"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def keys(self) -> set[str]:
        return {k for k, _ in self.accepted}

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def webhook() -> Iterator[FakeSlackWebhook]:
    fake = FakeSlackWebhook(failures=2)
    yield fake
    fake.close()


def _collapse(http: httpx.Client) -> list[dict]:
    for v in range(1, 24):
        http.post("/v1/policy", json={"version": v, "metrics": {"entropy": 1.0 if v <= 20 else 0.0}})
    r = http.post("/v1/alerts/evaluate")
    assert r.status_code == 200 and r.json()["transitions"][0]["to"] == "critical"
    return r.json()["transitions"]


def _wait(fake: FakeSlackWebhook, n: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while len(fake.keys()) < n and time.monotonic() < deadline:
        time.sleep(0.1)


def _wait_outbox_empty(db_url: str, timeout_s: float = 60) -> None:
    """Until no transition row is left in the webhook outbox (notified_at NULL)."""
    from sqlalchemy import text

    from service.store.db import get_engine

    deadline = time.monotonic() + timeout_s
    with get_engine(db_url).connect() as conn:
        while True:
            pending = conn.execute(text("SELECT count(*) FROM alert_transitions WHERE notified_at IS NULL")).scalar_one()
            conn.rollback()
            if pending == 0:
                return
            assert time.monotonic() < deadline, f"{pending} transitions still pending"
            time.sleep(0.05)


def test_transitions_are_posted_by_the_worker_retried_with_an_idempotency_key(fresh_db, webhook):
    env = {"GRPO_CURATOR_ALERT_WEBHOOK_URL": webhook.url, "GRPO_CURATOR_EMBEDDED_WORKER": "true"}
    server = start_server(fresh_db, env=env)
    try:
        http = httpx.Client(base_url=server.url, timeout=30)
        [change] = _collapse(http)
        assert http.post("/v1/groups", json=group("g-1", 23, ["42"])).status_code in (200, 201)  # ingest goes on
        _wait(webhook, 1)
        [(key, body)] = webhook.accepted
        assert webhook.requests == 3  # two failures, retried after a backoff, then delivered
        assert key == body["idempotency_key"] == f"alert-transition-{change['transition_id']}"
        assert isinstance(body["text"], str) and "entropy_collapse" in body["text"] and "CRITICAL" in body["text"]
        assert body["alert"]["monitor"] == "entropy_collapse" and body["to"] == "critical"
        # an admin's resolve: its text says who resolved it, not the value that opened the alert
        assert http.post(f"/v1/alerts/{change['alert']['id']}/resolve").status_code == 200
        _wait(webhook, 2)
        resolved = [b for _, b in webhook.accepted if b["to"] == "resolved"]
        assert len(resolved) == 1 and "by admin:" in resolved[0]["text"]
        assert str(change["alert"]["value"]) not in resolved[0]["text"] and resolved[0]["alert"]["value"] is None
        http.close()
    finally:
        stop_server(server)


def test_a_kill_9_between_commit_and_send_delivers_after_restart_once_per_transition(fresh_db):
    fake = FakeSlackWebhook(failures=0)
    try:
        # no worker: the transitions commit and nobody sends them; then the process dies hard
        server = start_server(fresh_db, env={"GRPO_CURATOR_ALERT_WEBHOOK_URL": fake.url})
        with httpx.Client(base_url=server.url, timeout=30) as http:
            changes = _collapse(http)
            r = http.put("/v1/monitors/error_rate", json={"action": "pause_leases"})
            assert r.status_code == 200
        server.proc.kill()
        server.proc.wait(timeout=10)
        assert fake.requests == 0
        env = {"GRPO_CURATOR_ALERT_WEBHOOK_URL": fake.url, "GRPO_CURATOR_EMBEDDED_WORKER": "true"}
        server = start_server(fresh_db, env=env)
        try:
            _wait(fake, len(changes))
            # every transition marked delivered, committed: the worker posts a row (before its commit marks
            # it) only while it is unmarked, so no later pass can send anything again, and what the fake got
            # by now is all it ever gets (what a fixed wait for a few more passes hoped to see)
            _wait_outbox_empty(fresh_db)
            expected = {f"alert-transition-{c['transition_id']}" for c in changes}
            assert fake.keys() == expected and len(fake.accepted) == len(expected)
        finally:
            stop_server(server)
    finally:
        fake.close()


def test_the_message_is_slack_compatible():
    from service.alerts.notifier import message
    from service.store.models import Alert, AlertTransition

    a = Alert(id="a", monitor="error_rate", dataset="gsm8k", threshold=0.2)
    t = AlertTransition(pk=7, alert_id="a", from_state="warning", to_state="critical", version=12, value=0.3,
                        reason="monitor")
    out = message(t, a)
    assert out["text"] == ("[CRITICAL] error_rate (dataset gsm8k): warning -> critical at policy version 12; "
                           "value 0.3, threshold 0.2")
    assert out["idempotency_key"] == "alert-transition-7" and out["transition_id"] == 7
    json.dumps(out)
