"""No response body, header or access-log line echoes an API token, whatever the path's shape.

Attack (round 2, /tmp/attack-svc/c_leak.py): ``/compat/openrlhf/key//<TOKEN>/code/get_reward``,
``key///<TOKEN>``, ``/compat/openrlhf/%2Fkey/<TOKEN>``, ``//compat/...``, ``/compat//openrlhf/...``,
``/compat/openrlhf//key/...`` and ``/compat/openrlhf/Key/...`` answered 404 with the token in the body: the
path-key middleware masked only the shapes it knew. Now anything token-shaped is redacted by pattern, in the
middleware (before routing, error handlers and the access log) and in the error handlers.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
from pathlib import Path

from service.api.errors import redact_tokens
from service.auth.service import new_token
from service.client import wait_healthy
from tests.conftest import ROOT, free_port


def test_redact_tokens_knows_the_token_format_new_token_makes() -> None:
    _, _, token = new_token()
    secret = token.split("_", 2)[2]
    for text in (token, f"/x/{token}/y", token.upper()[:4] + token[4:], f"?k={token}", token[4:]):
        assert secret not in redact_tokens(text), text


def shapes(tok: str) -> list[str]:
    return [
        f"/compat/openrlhf/key/{tok}", f"/compat/openrlhf/key/{tok}/", f"/compat/openrlhf/key/{tok}/code",
        f"/compat/openrlhf/key//{tok}/code/get_reward", f"/compat/openrlhf/key///{tok}",
        f"//compat/openrlhf/key/{tok}/code/get_reward", f"/compat//openrlhf/key/{tok}/code/get_reward",
        f"/compat/openrlhf//key/{tok}/code/get_reward", f"/compat/openrlhf/Key/{tok}/code/get_reward",
        f"/compat/openrlhf/%2Fkey/{tok}", f"/compat/openrlhf/key/{tok}/code/get_reward/",
        f"/compat/openrlhf/%6Bey/{tok}/code/get_reward", f"/compat/openrlhf/key%2F{tok}%2Fcode/get_reward",
        f"/compat/openrlhf/key/{tok};x/code/get_reward", f"/compat/openrlhf/key/.{tok}/code/get_reward",
        f"/compat/openrlhf/key/{tok}%00/code/get_reward", f"/compat/openrlhf/key/%00{tok}",
        f"/v1/groups/{tok}", f"/nowhere/{tok}", f"/compat/openrlhf/x?key={tok}",
        f"/compat/openrlhf/key/%67ck_{tok[4:]}/nope",
    ]


def test_no_path_shape_echoes_a_token_in_a_body_header_or_log_line(fresh_db: str, tmp_path: Path) -> None:
    _, _, token = new_token()  # token-shaped (no key stored: auth stays off, every route answers)
    secret = token.split("_", 2)[2]
    log = tmp_path / "serve.log"
    port = free_port()
    env = {**os.environ, "DATABASE_URL": fresh_db, "GRPO_CURATOR_EMBEDDED_WORKER": "false",
           "GRPO_CURATOR_LOG_LEVEL": "info"}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
                                env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    seen: list[str] = []
    statuses: set[int] = set()
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, timeout_s=60)
        body = b'{"query":["Qx"],"prompts":["Q"]}'
        for method in ("GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD"):
            for path in shapes(token):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                try:
                    conn.putrequest(method, path, skip_accept_encoding=True)
                    payload = body if method in ("POST", "PUT", "DELETE") else b""
                    if payload:
                        conn.putheader("content-type", "application/json")
                        conn.putheader("content-length", str(len(payload)))
                    conn.endheaders(payload or None)
                    r = conn.getresponse()
                    statuses.add(r.status)
                    seen.append(f"{r.status} {r.getheaders()} {r.read().decode('latin-1')}")
                finally:
                    conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert 404 in statuses and 405 in statuses  # the error handlers were exercised
    leaks = [s for s in seen if secret in s]
    assert not leaks, leaks[:3]
    logged = log.read_text(errors="replace")
    assert "redacted" in logged  # the access log saw these requests, masked
    assert secret not in logged
