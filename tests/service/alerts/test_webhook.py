"""The webhook notifier: every transition posted as Slack-compatible JSON, retried, never blocking the
request that caused it. The receiver is a fake (we cannot run Slack here) speaking plain HTTP on 127.0.0.1."""

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
    """A fake incoming-webhook endpoint: holds its first request until ``release`` is set, answers 500 to
    the first ``failures`` requests and 200 ("ok", as Slack does) after; records every JSON body."""

    def __init__(self, failures: int) -> None:
        self.failures, self.requests, self.accepted = failures, 0, []
        self.holding = threading.Event()
        self.release = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests += 1
                if fake.requests == 1:
                    fake.holding.set()
                    fake.release.wait(60)
                ok = fake.requests > fake.failures
                if ok:
                    fake.accepted.append(body)
                self.send_response(200 if ok else 500)
                self.end_headers()
                self.wfile.write(b"ok" if ok else b"error")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T0/B0/x"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()


@pytest.fixture
def webhook() -> Iterator[FakeSlackWebhook]:
    fake = FakeSlackWebhook(failures=2)
    yield fake
    fake.close()


def test_transitions_are_posted_retried_and_never_block_the_request(fresh_db, webhook):
    server = start_server(fresh_db, env={"GRPO_CURATOR_ALERT_WEBHOOK_URL": webhook.url})
    try:
        http = httpx.Client(base_url=server.url, timeout=30)
        for v in range(1, 24):
            http.post("/v1/policy", json={"version": v, "metrics": {"entropy": 1.0 if v <= 20 else 0.0}})
        r = http.post("/v1/alerts/evaluate")
        assert r.status_code == 200 and r.json()["transitions"][0]["to"] == "critical"
        assert webhook.holding.wait(30)  # the webhook has the post and does not answer ...
        # ... yet ingest and evaluation answer meanwhile
        assert http.post("/v1/groups", json=group("g-1", 23, ["42"])).status_code in (200, 201)
        assert http.post("/v1/alerts/evaluate").status_code == 200
        assert not webhook.accepted and not webhook.release.is_set()
        webhook.release.set()
        deadline = time.monotonic() + 60
        while not webhook.accepted and time.monotonic() < deadline:
            time.sleep(0.1)
        [body] = webhook.accepted
        assert webhook.requests == 3  # two failures, retried, then delivered
        assert isinstance(body["text"], str) and "entropy_collapse" in body["text"] and "CRITICAL" in body["text"]
        assert body["alert"]["monitor"] == "entropy_collapse" and body["to"] == "critical"
        http.close()
    finally:
        stop_server(server)


def test_the_message_is_slack_compatible():
    from service.alerts.notifier import message

    change = {"alert": {"id": "a", "monitor": "error_rate", "dataset": "gsm8k", "value": 0.3, "threshold": 0.2},
              "from": "warning", "to": "critical", "version": 12}
    out = message(change)
    assert out["text"] == ("[CRITICAL] error_rate (dataset gsm8k): warning -> critical at policy version 12; "
                           "value 0.3, threshold 0.2")
    json.dumps(out)
