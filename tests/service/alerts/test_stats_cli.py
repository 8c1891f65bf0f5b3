"""``grpo-curator stats`` lists the open alerts under its table (a real CLI process against a real server)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]


def _stats(url: str) -> str:
    env = {**os.environ, "GRPO_CURATOR_URL": url}
    proc = subprocess.run([sys.executable, "-m", "service.cli", "stats"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_stats_prints_the_open_alerts(live_server):
    assert "alerts: none open" in _stats(live_server.url)
    for v in range(1, 24):
        httpx.post(live_server.url + "/v1/policy", json={"version": v, "metrics": {"entropy": 1.0 if v <= 20 else 0.1}})
    [change] = httpx.post(live_server.url + "/v1/alerts/evaluate").json()["transitions"]
    out = _stats(live_server.url)
    assert "alerts: 1 open" in out
    line = next(row for row in out.splitlines() if "entropy_collapse" in row)
    assert "CRITICAL" in line and "(overall)" in line and "value 0.9 >= 0.8" in line and change["alert"]["id"] in line
