"""Attack findings on the i15 work (docs, CLI, no leftovers, dashboard v2, metrics): each test shows one
break with real parts (real PostgreSQL, the real app over HTTP / TestClient, real subprocesses)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

from tests.conftest import ROOT


def _label_values(text: str, metric: str, label: str) -> set[str]:
    pattern = re.compile(rf'^{metric}\{{[^}}]*\b{label}="([^"]*)"', re.M)
    return set(pattern.findall(text))


def test_metrics_method_label_is_bounded_under_arbitrary_http_methods(client):
    """Any client can make up HTTP methods (h11 accepts any token); every one becomes a new label value
    of grpo_curator_http_request_duration_seconds (x ~15 buckets x every route and status): the series
    count grows without bound -- the same cardinality blow-up the route template was meant to prevent."""
    for i in range(40):
        method = f"X{uuid.uuid4().hex[:10].upper()}"
        client.request(method, "/v1/groups")  # 405 on a real route
        client.request(method, f"/no/such/{i}")  # 404
    text = client.get("/metrics").text
    methods = _label_values(text, "grpo_curator_http_request_duration_seconds_count", "method")
    assert len(methods) <= 10, f"{len(methods)} method label values, e.g. {sorted(methods)[:5]}"


def test_serve_with_a_log_level_python_accepts_serves_or_says_so_clearly(fresh_db):
    """`--log-level warn` (or fatal) passes the CLI's check (Python's logging knows WARN / FATAL), then
    uvicorn -- which knows only critical/error/warning/info/debug/trace -- raises KeyError: the user gets
    "error: KeyError: 'warn'", after the database was already migrated."""
    import socket

    env = {**os.environ, "DATABASE_URL": fresh_db, "GRPO_CURATOR_EMBEDDED_WORKER": "false"}
    for level in ("warn", "fatal"):
        with socket.socket() as busy:  # a port in use (port 1 is free to bind for root): serve then fails
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = str(busy.getsockname()[1])
            proc = subprocess.run([sys.executable, "-m", "service.cli", "--log-level", level, "serve", "--port", port],
                                  env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert "KeyError" not in proc.stderr, proc.stderr
        # either it is rejected up front with the accepted levels named, or it runs (the busy port then fails)
        assert "warning" in proc.stderr or "--log-level" in proc.stderr or "address already in use" in proc.stderr, \
            proc.stderr
    bogus = subprocess.run([sys.executable, "-m", "service.cli", "--log-level", "notset", "serve"], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert bogus.returncode == 1 and bogus.stderr.strip().splitlines() == [bogus.stderr.strip()], bogus.stderr
    assert "--log-level" in bogus.stderr and "warning" in bogus.stderr, bogus.stderr


def _pids(marker) -> list[int]:
    """Live processes naming ``marker`` in their command line or environment (the demo's service gets
    its data dir only through GRPO_CURATOR_DATA_DIR)."""
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().split(") ")[-1].startswith("Z"):
                continue  # a zombie is not running
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if str(marker).encode() in blob:
            found.append(int(entry.name))
    return found


def _describe(marker) -> str:
    lines = []
    for pid in _pids(marker):
        try:
            lines.append(f"{pid}: " + open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()[:160])
        except OSError:
            pass
    return "; ".join(lines)


def _wait_for(pred, timeout_s: float, step: float = 0.3) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


def _reap(marker) -> None:
    """Stop what a broken run left (only processes naming this test's own temp dir)."""
    import signal
    import time

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _pids(marker):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        while _pids(marker) and time.monotonic() < deadline:
            time.sleep(0.3)


def _start_demo(out):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GRPO_CURATOR_DATABASE_URL")}
    return subprocess.Popen([sys.executable, "-m", "service.cli", "demo", "--versions", "50", "--minutes", "5",
                             "--out", str(out)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_sigterm_to_the_demo_while_its_service_starts_leaves_nothing(tmp_path):
    """`kill <demo pid>` (or `timeout`, a CI job cancel) in the first seconds, while start_service waits
    for /healthz: SystemExit leaves wait_healthy, but the serve process is not yet in the list the
    finally-block stops, so `grpo-curator serve` and its embedded PostgreSQL keep running for ever."""
    import signal

    out = tmp_path / "demo"
    proc = _start_demo(out)
    try:
        # the service has started its embedded PostgreSQL and is migrating: the demo is in wait_healthy
        assert _wait_for(lambda: "bin/postgres" in _describe(out), 120, step=0.1), "the demo never started its service"
        os.kill(proc.pid, signal.SIGTERM)  # the demo only, as `kill PID` does
        proc.wait(timeout=60)
        assert _wait_for(lambda: not _pids(out), 30), \
            "left running: " + _describe(out)
    finally:
        if proc.poll() is None:
            proc.kill()
        _reap(out)


def test_sigkill_of_the_demo_leaves_no_process(tmp_path):
    """kill -9 of the demo (OOM killer, a CI runner's hard stop): its children have no tie to it (no
    PR_SET_PDEATHSIG, no parent watch), so the service, the embedded PostgreSQL, the trainer and the
    rollout producer all keep running, the producer sampling for ever."""
    import signal

    out = tmp_path / "demo"
    proc = _start_demo(out)
    try:
        assert _wait_for(lambda: "trainer.worker" in _describe(out) and "rollout.producer" in _describe(out), 240), \
            "the demo never started its workers"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert _wait_for(lambda: not _pids(out), 30), "left running: " + _describe(out)
    finally:
        if proc.poll() is None:
            proc.kill()
        _reap(out)



def test_grafana_consumption_panel_measures_consumption():
    """deploy/grafana: the panel "Ready groups consumed per minute" is -60 * deriv(ready queue depth) --
    the net change of the ready queue, not consumption: with producers keeping the queue level it reads 0
    while the trainer consumes hundreds of groups a minute (and it goes negative when producers run
    ahead). Consumption is the growth of grpo_curator_groups{status="consumed"}."""
    import json

    board = json.loads((ROOT / "deploy" / "grafana" / "grpo-curator.json").read_text())
    panels = [p for p in board["panels"] if "consum" in p.get("title", "").lower()]
    assert panels, "no consumption panel"
    for panel in panels:
        exprs = " ".join(t["expr"] for t in panel["targets"])
        assert 'status="consumed"' in exprs, f"{panel['title']}: {exprs}"


def test_trainer_view_draws_extreme_but_valid_metric_values_without_errors(live_server, tmp_path):
    """Metrics are free-form JSON numbers. A diverging run that publishes loss 1.7e308 then -1.7e308 (both
    finite doubles) makes the y range overflow to Infinity; every tick and dot gets NaN coordinates and
    Chromium logs 'Error: <circle> attribute cy: Expected length, "NaN"' -- the chart is empty."""
    import httpx
    import pytest

    from tests.service.observability.cdp import Browser, find_chromium

    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed")
    for version, loss in ((1, 1.7e308), (2, -1.7e308), (3, 0.5)):
        r = httpx.post(live_server.url + "/v1/policy", json={"version": version, "metrics": {"loss": loss}})
        assert r.status_code == 201, r.text
    browser = Browser(chromium, tmp_path / "profile")
    try:
        browser.goto(live_server.url + "/dashboard#trainer")
        browser.wait_for("document.querySelectorAll('.chart').length >= 5")
        import time

        time.sleep(1)
        browser.screenshot(tmp_path / "trainer-extreme.png")
        assert browser.errors == [], browser.errors[:3]
    finally:
        browser.close()
