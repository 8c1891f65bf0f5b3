"""The monitor-state gauge on /metrics and the deploy/ rules file that routes it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.service.alerts.helpers import evaluate, publish

RULES = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "alerts.rules.yml"


def _gauge(text: str, monitor: str, dataset: str = "") -> float:
    line = f'grpo_curator_monitor_state{{dataset="{dataset}",monitor="{monitor}"}} '
    return float(next(row for row in text.splitlines() if row.startswith(line)).split()[-1])


def test_metrics_export_each_monitor_state(api):
    for v in range(1, 21):
        publish(api, v, entropy=1.0)
    evaluate(api)
    text = api.get("/metrics").text
    assert _gauge(text, "entropy_collapse") == 0 and _gauge(text, "error_rate") == 0
    for v in range(21, 24):
        publish(api, v, entropy=0.0)
    [change] = evaluate(api)
    assert _gauge(api.get("/metrics").text, "entropy_collapse") == 2
    api.post(f"/v1/alerts/{change['alert']['id']}/resolve")
    assert _gauge(api.get("/metrics").text, "entropy_collapse") == 0


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_promtool_accepts_the_rules_file():
    out = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 rules found" in out.stdout
