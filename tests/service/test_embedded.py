"""The embedded default: `grpo-curator serve` with no DATABASE_URL starts pgserver, stores, restarts, keeps data."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx

from service.client import wait_healthy
from tests.conftest import ROOT, free_port
from tests.helpers import make_group


def _serve(data_dir, port):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GRPO_CURATOR_DATABASE_URL")}
    env.update(GRPO_CURATOR_DATA_DIR=str(data_dir), GRPO_CURATOR_EMBEDDED_WORKER="false", GRPO_CURATOR_LOG_LEVEL="warning")
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, timeout_s=90)
    return proc, url


def _stop(proc):
    proc.terminate()
    proc.wait(timeout=30)


def test_embedded_default_survives_restart(tmp_path):
    data_dir = tmp_path / "state"
    proc, url = _serve(data_dir, free_port())
    try:
        assert httpx.post(url + "/v1/groups", json=make_group("emb-1")).status_code == 201
    finally:
        _stop(proc)
    assert (data_dir / "pgdata" / "PG_VERSION").exists()
    proc, url = _serve(data_dir, free_port())
    try:
        got = httpx.get(url + "/v1/groups/emb-1").json()
        assert got["id"] == "emb-1" and len(got["trajectories"]) == 4
    finally:
        _stop(proc)
