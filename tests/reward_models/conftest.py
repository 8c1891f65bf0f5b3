"""Fixtures for reward-component tests: a fake OpenAI-compatible judge server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

# ("answer", text) | ("status", code) | ("sleep", s, text) | ("raw", body) | ("peak", n, timeout_s, s, text): hold
# each request until n were in flight at once (or timeout_s passes), then as ("sleep", s, text)
Behaviour = tuple[Any, ...]


class FakeOpenAIServer(ThreadingHTTPServer):
    """An in-test HTTP server speaking the OpenAI chat-completions wire format.

    ``script`` is consumed one behaviour per request; when empty, ``default`` answers (a callable of
    the request body, or a behaviour). Records every request body, its headers and arrival time, and
    the most requests it had in flight at once. While ``default`` is called, ``local.headers`` holds the
    headers of the request it answers (the caller's bearer key says which client sent it).
    """

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script: list[Behaviour] = []
        self.default: Behaviour | Callable[[dict], Behaviour] = ("answer", "Score: 5")
        self.requests: list[dict] = []
        self.headers_seen: list[dict[str, str]] = []
        self.arrivals: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.local = threading.local()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out closed the socket under a sleeping handler: expected, not noise."""

    def next_behaviour(self, body: dict) -> Behaviour:
        with self.lock:
            if self.script:
                return self.script.pop(0)
        return self.default(body) if callable(self.default) else self.default


def completion(content: str, model: str) -> dict:
    """A chat.completion response body."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class _Handler(BaseHTTPRequestHandler):
    server: FakeOpenAIServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence request logs
        pass

    def _send(self, code: int, payload: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        if self.path != "/v1/chat/completions":
            self._send(404, b'{"error": {"message": "not found"}}')
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        with server.lock:
            server.requests.append(body)
            server.headers_seen.append(dict(self.headers))
            server.arrivals.append(time.monotonic())
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
            server.arrived.notify_all()
        server.local.headers = dict(self.headers)
        try:
            self._behave(server.next_behaviour(body), body)
        finally:
            with server.lock:
                server.in_flight -= 1

    def _behave(self, behaviour: Behaviour, body: dict) -> None:
        kind = behaviour[0]
        if kind == "peak":
            server = self.server
            with server.arrived:
                server.arrived.wait_for(lambda: server.max_in_flight >= behaviour[1], timeout=behaviour[2])
            behaviour, kind = ("sleep", *behaviour[3:]), "sleep"
        if kind == "sleep":
            time.sleep(behaviour[1])
            behaviour = ("answer", behaviour[2])
            kind = "answer"
        if kind == "answer":
            self._send(200, json.dumps(completion(behaviour[1], body.get("model", ""))).encode())
        elif kind == "status":
            error = {"error": {"message": "fake failure", "type": "server_error", "code": behaviour[1]}}
            self._send(behaviour[1], json.dumps(error).encode())
        elif kind == "raw":
            self._send(200, behaviour[1].encode(), "text/plain")


@pytest.fixture
def fake_judge() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
