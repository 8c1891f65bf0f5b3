"""deploy/grafana: the panels' queries, evaluated by a real Prometheus scraping a real service. No panel takes
``rate()`` / ``irate()`` / ``increase()`` of a gauge; "Component error rate" reads 0 (not "no data") when no
component failed, before any scoring and after; "Groups consumed per minute" evaluates on the gauge."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import httpx
import pytest

from tests.conftest import ROOT, free_port

BOARD = json.loads((ROOT / "deploy" / "grafana" / "grpo-curator.json").read_text())


def _expr(title_part: str) -> str:
    panel = next(p for p in BOARD["panels"] if title_part in p["title"].lower())
    return panel["targets"][0]["expr"]


def test_no_panel_takes_a_counter_function_of_a_gauge(live_server):
    page = httpx.get(f"{live_server.url}/metrics").text
    gauges = set(re.findall(r"^# TYPE (\S+) gauge", page, re.M))
    assert "grpo_curator_groups" in gauges
    for panel in BOARD["panels"]:
        for target in panel["targets"]:
            for fn, arg in re.findall(r"\b(rate|irate|increase)\(\s*([a-z_:]+)", target["expr"]):
                assert arg not in gauges, f"{panel['title']}: {fn}() of the gauge {arg}"


def _query(prom: str, expr: str) -> list[dict]:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "success", r.text
    return r.json()["data"]["result"]


def _wait(prom: str, expr: str, ok, what: str, deadline_s: float = 60, between=None) -> list[dict]:
    end = time.monotonic() + deadline_s
    while True:
        if between is not None:
            between()
        got = _query(prom, expr)
        if ok(got):
            return got
        if time.monotonic() > end:
            raise AssertionError(f"{what}: {expr} -> {got}")
        time.sleep(0.5)


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs the prometheus binary (apt install prometheus)")
def test_panels_evaluated_by_prometheus(live_server, tmp_path):
    host_port = live_server.url.split("://", 1)[1]
    config = tmp_path / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: curator\n"
                      f"    static_configs:\n      - targets: ['{host_port}']\n")
    port = free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prom = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{prom}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < end and proc.poll() is None, "prometheus did not start"
            time.sleep(0.3)
        error_rate, consumed = _expr("component error rate"), _expr("consumed")
        _wait(prom, 'up{job="curator"}', lambda r: r and r[0]["value"][1] == "1", "scraped")
        # nothing scored yet: 0, not an empty answer (Grafana's "no data")
        assert [s["value"][1] for s in _query(prom, error_rate)] == ["0"]
        items = [{"prompt": "6*7?", "completion": f"<answer>{a}</answer>", "reference": {"answer": "42"}}
                 for a in ("42", "41", "x")]

        def score() -> None:  # scoring goes on across scrapes, so the rates are above 0
            r = httpx.post(f"{live_server.url}/v1/score", json={"reward_spec": "math-r1", "items": items}, timeout=60)
            assert r.status_code == 200, r.text

        # scored, nothing failed: each component's rate is 0 (its error series exists at 0)
        got = _wait(prom, error_rate, lambda r: {s["metric"].get("component") for s in r} >= {"correct", "format"},
                    "per-component error rate", between=score)
        assert {s["metric"]["component"]: s["value"][1] for s in got} == {"correct": "0", "format": "0"}
        got = _wait(prom, consumed, lambda r: bool(r), "consumed per minute")
        assert [s["value"][1] for s in got] == ["0"]  # nothing acked
    finally:
        proc.terminate()
        proc.wait(timeout=30)
