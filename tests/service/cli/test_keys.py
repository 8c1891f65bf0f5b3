"""`grpo-curator keys` and `serve`'s auth gate, through real processes on a real database."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
from sqlalchemy import create_engine, text

from service.client import CuratorClient, CuratorError
from tests.conftest import ROOT, free_port, start_server, stop_server
from tests.helpers import secret_of


def _cli(db_url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": db_url, "GRPO_CURATOR_EMBEDDED_WORKER": "false"}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def _keys(forked, db_url: str, *args: str) -> subprocess.CompletedProcess:
    """``grpo-curator keys ARGS`` in a command process forked from the module's zygote, which imported the CLI
    once (tests/service/cli/commands.py): ~1 s of CPU less than a new Python each."""
    env = {**os.environ, "DATABASE_URL": db_url, "GRPO_CURATOR_EMBEDDED_WORKER": "false"}
    return forked.run_env(["keys", *args], env)


def test_non_loopback_serve_without_keys_refuses_with_how_to(fresh_db: str) -> None:
    r = _cli(fresh_db, "serve", "--host", "0.0.0.0", "--port", str(free_port()), timeout=60)
    assert r.returncode != 0
    assert "refusing to serve on 0.0.0.0 without API keys" in r.stderr
    assert "grpo-curator keys create --role admin" in r.stderr and "--insecure-no-auth" in r.stderr


def test_keys_cli_create_list_revoke_and_a_served_request(fresh_db: str, forked) -> None:
    made = _keys(forked, fresh_db, "create", "--role", "trainer", "--name", "gpu-7", "--dataset", "math")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    assert token.startswith("gck_") and token not in made.stderr
    listed = _keys(forked, fresh_db, "list")
    assert "gpu-7" in listed.stdout and "trainer" in listed.stdout and "math" in listed.stdout
    assert token not in listed.stdout and secret_of(token) not in listed.stdout
    dup = _keys(forked, fresh_db, "create", "--role", "viewer", "--name", "gpu-7")
    assert dup.returncode == 2 and "name: a key named 'gpu-7' already exists" in dup.stderr
    server = start_server(fresh_db, env={"GRPO_CURATOR_LOG_LEVEL": "info"})
    try:
        assert httpx.get(server.url + "/v1/policy").status_code == 401
        with CuratorClient(server.url, api_key=token) as c:
            assert c.get_policy()["version"] == 0
        assert _keys(forked, fresh_db, "revoke", "gpu-7").returncode == 0
        with CuratorClient(server.url, api_key=token) as c, pytest.raises(CuratorError) as exc:
            c.get_policy()
        assert exc.value.status_code == 401
    finally:
        stop_server(server)
    log = server.proc.stderr.read().decode()  # type: ignore[union-attr]
    assert "auth on" in log and token not in log and secret_of(token) not in log
    engine = create_engine(fresh_db)
    with engine.connect() as conn:  # nothing in the database holds the token or its secret
        dump = conn.execute(text("SELECT string_agg(row_to_json(k)::text, '') FROM api_keys k")).scalar()
    engine.dispose()
    assert secret_of(token) not in dump


def test_loopback_serve_without_keys_stays_open_and_says_so(fresh_db: str) -> None:
    server = start_server(fresh_db, env={"GRPO_CURATOR_LOG_LEVEL": "info"})
    try:
        assert httpx.get(server.url + "/v1/policy").status_code == 200
    finally:
        stop_server(server)
    log = server.proc.stderr.read().decode()  # type: ignore[union-attr]
    assert log.count("auth off: no API key exists") == 1
