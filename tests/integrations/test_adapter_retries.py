"""The adapters' one HTTP path retries only what another try can change, against a real HTTP server that
answers a script (``fake_service``: the service's wire format, one scripted answer per request)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from grpo_curator_integrations import _http
from grpo_curator_integrations._http import Client, ScoringError, Target

OK = (200, {}, {"results": [{"total": 1.0, "outcome": 1.0, "rewards": {}}]})
FAIL_MODE = (503, {}, {"error": "could not score: correct: ZeroDivisionError", "detail": None})  # openrlhf_on_error=fail
BREAKER = (503, {}, {"error": "scoring paused", "detail": {"alert": {"id": "a1"}}})
UNAVAILABLE = (503, {"Retry-After": "0"}, {"error": "database: unavailable; retry later", "detail": None})
BUSY = (429, {"Retry-After": "0"}, {"error": "too many requests in flight", "detail": None})


SLOW = -1
real_sleep = _http.time.sleep


class FakeService(ThreadingHTTPServer):
    script: list[tuple[int, dict[str, str], dict]]
    seen: list[str]


class _Handler(BaseHTTPRequestHandler):
    server: FakeService

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.seen.append(self.path)
        status, headers, body = self.server.script.pop(0) if self.server.script else OK
        if status == SLOW:  # answer only after the client's read timeout
            real_sleep(float(headers["seconds"]))
            status, headers, body = OK
        data = json.dumps(body).encode()
        self.send_response(status)
        for k, v in {"content-type": "application/json", "content-length": str(len(data)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeService]:
    monkeypatch.setattr(_http.time, "sleep", lambda s: None)  # the backoff's waits, not what is tested
    server = FakeService(("127.0.0.1", 0), _Handler)
    server.script, server.seen = [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def client(server: FakeService) -> Client:
    return Client(Target(f"http://127.0.0.1:{server.server_address[1]}", "s", None), timeout_s=10, retries=3)


@pytest.mark.parametrize(("answer", "status"), [(FAIL_MODE, 503), (BREAKER, 503), ((500, {}, {"error": "bug"}), 500),
                                                ((422, {}, {"error": "items[0].prompt: missing"}), 422)])
def test_a_deterministic_error_is_sent_once(fake_service: FakeService, answer, status: int) -> None:
    fake_service.script = [answer, OK, OK]
    with pytest.raises(ScoringError) as err:
        client(fake_service).score([{"prompt": "p", "completion": "c"}])
    assert err.value.status == status and err.value.args[0].endswith(answer[2]["error"])
    assert fake_service.seen == ["/v1/score"]  # one request: the same one would get the same answer


@pytest.mark.parametrize("answer", [UNAVAILABLE, BUSY, (502, {}, {"error": "bad gateway"}),
                                    (504, {}, {"error": "gateway timeout"})])
def test_what_can_change_is_retried(fake_service: FakeService, answer) -> None:
    fake_service.script = [answer, answer, OK]
    [result] = client(fake_service).score([{"prompt": "p", "completion": "c"}])
    assert result["total"] == 1.0 and len(fake_service.seen) == 3


def test_retries_run_out_with_the_last_answer(fake_service: FakeService) -> None:
    fake_service.script = [UNAVAILABLE] * 3 + [OK]
    with pytest.raises(ScoringError) as err:
        client(fake_service).score([{"prompt": "p", "completion": "c"}])
    assert err.value.status == 503 and len(fake_service.seen) == 3


def test_a_connection_error_is_retried_then_raised() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = Client(Target(f"http://127.0.0.1:{port}", "s", None), timeout_s=2, retries=2)
    with pytest.raises(httpx.ConnectError):
        c.score([{"prompt": "p", "completion": "c"}])


def test_a_read_timeout_on_score_is_not_retried(fake_service: FakeService) -> None:
    """The service got the request and may be scoring it: a retry would score it again (no idempotency key)."""
    fake_service.script = [(SLOW, {"seconds": "2"}, {}), OK, OK]
    c = Client(Target(f"http://127.0.0.1:{fake_service.server_address[1]}", "s", None), timeout_s=0.5, retries=3)
    with pytest.raises(httpx.ReadTimeout):
        c.score([{"prompt": "p", "completion": "c"}])
    assert fake_service.seen == ["/v1/score"]


def test_a_malformed_key_is_not_retried(fake_service: FakeService) -> None:
    c = Client(Target(f"http://127.0.0.1:{fake_service.server_address[1]}", "s", "gck_x\n"), retries=3)
    with pytest.raises(httpx.LocalProtocolError):
        c.score([{"prompt": "p", "completion": "c"}])
    assert fake_service.seen == []


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e400"])
def test_a_retry_after_that_is_not_finite_is_the_backoff(fake_service: FakeService, value: str) -> None:
    assert _http.retry_delay(httpx.Response(503, headers={"Retry-After": value}), attempt=1) == 1.0
    fake_service.script = [(503, {"Retry-After": value}, {"error": "unavailable"}), OK]
    [result] = client(fake_service).score([{"prompt": "p", "completion": "c"}])
    assert result["total"] == 1.0 and len(fake_service.seen) == 2


@pytest.mark.parametrize(("value", "delay"), [("3", 3.0), ("0", 0.0), ("999", _http.MAX_RETRY_AFTER_S),
                                              ("-4", 0.0), ("Wed, 21 Oct 2015 07:28:00 GMT", 1.0)])
def test_retry_delay_follows_retry_after(value: str, delay: float) -> None:
    r = httpx.Response(503, headers={"Retry-After": value})
    assert _http.retry_delay(r, attempt=1) == delay


def test_a_short_answer_fails_every_shared_call(fake_service: FakeService) -> None:
    """The service answers fewer results than items: every waiting verl call gets an error, none hangs."""
    import asyncio

    from grpo_curator_integrations.verl import _Sharer

    fake_service.script = [OK, OK]  # OK holds one result; the shared request carries three items
    sharer = _Sharer(client(fake_service))

    async def main() -> list:
        calls = [sharer.score({"prompt": "p", "completion": str(i)}) for i in range(3)]
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout=30)

    outcomes = asyncio.run(main())
    assert all(isinstance(o, ScoringError) and "1 results for 3 items" in str(o) for o in outcomes), outcomes
    assert not sharer.running and sharer.pending == []
