"""/metrics exposes request, lease-wait and scoring histograms after real traffic, and a score worker
serves its own metrics on --metrics-port."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid

import httpx

from reward_models.base import ComponentResult
from reward_models.scoring import Scorer
from service.observability.metrics import observe_components
from service.worker.pipeline import drain
from tests.conftest import ROOT, free_port
from tests.helpers import make_group


def _value(text: str, name: str, **labels: str) -> float:
    """The sample ``name{labels...}`` in a Prometheus text page (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")])) if "{" in line else {}
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_request_histograms_by_route_template_and_status(api):
    before = api.get("/metrics").text
    count = "grpo_curator_http_request_duration_seconds_count"
    route = "/v1/groups/{group_id}"
    assert api.post("/v1/groups", json=make_group("met-1")).status_code == 201
    for _ in range(3):
        assert api.get("/v1/groups/no-such-group").status_code == 404
    assert api.get("/v1/groups/met-1").status_code == 200
    assert api.get("/no/such/route").status_code == 404
    text = api.get("/metrics").text
    delta = lambda **lb: _value(text, count, **lb) - _value(before, count, **lb)  # noqa: E731
    assert delta(method="GET", route=route, status="404") == 3
    assert delta(method="GET", route=route, status="200") == 1
    assert delta(method="POST", route="/v1/groups", status="201") == 1
    assert delta(method="GET", route="unmatched", status="404") == 1
    assert "no-such-group" not in text and "/no/such/route" not in text  # ids never become labels
    assert 'grpo_curator_groups{status="received"} 1.0' in text  # queue depth by status
    bucket = _value(text, "grpo_curator_http_request_duration_seconds_bucket", route=route, status="404", le="+Inf")
    assert bucket - _value(before, "grpo_curator_http_request_duration_seconds_bucket", route=route, status="404", le="+Inf") == 3


def test_lease_wait_histogram(api):
    before = api.get("/metrics").text
    r = api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 1, "wait_seconds": 0.3})
    assert r.status_code == 204
    text = api.get("/metrics").text
    name = "grpo_curator_lease_wait_seconds"
    assert _value(text, name + "_count", result="empty") - _value(before, name + "_count", result="empty") == 1
    waited = _value(text, name + "_sum", result="empty") - _value(before, name + "_sum", result="empty")
    assert waited >= 0.3  # the wait is measured, not the handler's CPU time


def test_component_latency_and_errors_after_scoring(api):
    """Each series is read by all its labels (kind and path too): in a full run other tests' components are
    also named ``correct`` (another kind, or scored inline) and ``_value`` returns the first series that
    matches, so a lookup by component and result alone read one that never moves (this test was skipped
    for that, as order-dependent, from 2026-11-30 to 2026-12-07)."""
    r = api.post("/v1/reward-specs", json={"name": "m", "components": [
        {"name": "correct", "kind": "verifier.math", "outcome": True},
        # no metadata["env"] on any sample: an error per sample (ingest cannot know it is missing)
        {"name": "tests", "kind": "external.reported", "weight": 0.0, "params": {"key": "env"}},
    ]})
    assert r.status_code == 201, r.text
    assert api.put("/v1/datasets/toy", json={"reward_spec": "m"}).status_code in (200, 201)
    # what a full run leaves in this process first: series of other components named like these ones
    decoy = ComponentResult(value=1.0, details={})
    observe_components({"correct": "verifier.exact", "tests": "verifier.exact"},
                       [{"correct": decoy, "tests": ComponentResult(value=None, details={}, error="x")}], path="score")
    before = api.get("/metrics").text
    r = api.post("/v1/groups", json=make_group("met-s", answers=["42", "41", "42", "7"]))
    assert r.status_code == 201, r.text
    with Scorer(processes=1, timeout_s=20) as scorer:
        drain(api.factory, scorer, max_attempts=1)
    text = api.get("/metrics").text
    results = "grpo_curator_component_results_total"
    d = lambda n, t, **lb: _value(t, n, **lb)  # noqa: E731
    # the counters are process-wide: in a full run another test's in-process worker may add to them, so
    # at least this group's four samples must be counted
    ok = {"kind": "verifier.math", "component": "correct", "result": "ok", "path": "worker"}
    error = {"kind": "external.reported", "component": "tests", "result": "error", "path": "worker"}
    assert d(results, text, **ok) - d(results, before, **ok) >= 4
    assert d(results, text, **error) - d(results, before, **error) >= 4
    latency = "grpo_curator_component_latency_seconds_count"
    series = {"kind": "verifier.math", "component": "correct", "path": "worker"}
    assert d(latency, text, **series) - d(latency, before, **series) >= 4


def test_score_worker_serves_its_own_metrics(fresh_db, tmp_path):
    """Its stderr goes to a file, never an unread pipe (a full pipe would block the worker's next log line, and
    with it its shutdown); a worker that does not stop within 30 s of SIGTERM is sent SIGABRT, which
    PYTHONFAULTHANDLER turns into every thread's stack in that file, and the failure shows it."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": fresh_db, "GRPO_CURATOR_WORKER_METRICS_PORT": str(port),
           "PYTHONFAULTHANDLER": "1"}
    log = tmp_path / "score-worker.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", "score-worker", "--processes", "1"],
                                env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=sink)
    try:
        deadline, text = time.monotonic() + 60, ""
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert "grpo_curator_component_latency_seconds" in text, log.read_text()[-3000:]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # faulthandler writes the stacks, then the process dies
            proc.wait(timeout=30)
            raise AssertionError(f"score-worker did not stop within 30 s of SIGTERM: {log.read_text()[-6000:]}") from None
    assert proc.returncode in (0, 128 + signal.SIGTERM)  # stopped cleanly either way (no traceback)



def test_grafana_dashboard_queries_only_metrics_the_service_exposes(api):
    """Every metric a panel of deploy/grafana/grpo-curator.json queries exists on /metrics after traffic."""
    import json

    from tests.conftest import ROOT

    dash = json.loads((ROOT / "deploy" / "grafana" / "grpo-curator.json").read_text())
    api.post("/v1/groups", json=make_group("graf-1"))
    api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 1})
    from reward_models.base import ComponentResult
    from service.observability import metrics as process_metrics

    process_metrics.observe_components({"fmt": "rule.format"}, [{"fmt": ComponentResult(value=1.0, details={})}])  # a worker's
    page = api.get("/metrics").text
    exposed = {line.split("{")[0].split(" ")[0] for line in page.splitlines() if line and line[0] != "#"}
    exposed |= {m + "_total" for m in re.findall(r"^# TYPE (\S+) counter", page, re.M)}
    exposed |= set(re.findall(r"^# TYPE (\S+) gauge", page, re.M))  # labelled gauges with no sample yet
    queried = {
        name
        for panel in dash["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bgrpo_curator_[a-z_]+", target["expr"])
    }
    assert queried and queried <= exposed, queried - exposed
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def _label_values(text: str, metric: str, label: str) -> set[str]:
    pattern = re.compile(rf'^{metric}\{{[^}}]*\b{label}="([^"]*)"', re.M)
    return set(pattern.findall(text))


# Attack: made-up HTTP methods each became a new metrics label value (unbounded cardinality).
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
