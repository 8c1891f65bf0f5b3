"""The circuit breaker: while a pause_leases alert is critical, POST /v1/batches/lease answers 503 with
Retry-After and the alert; producers keep posting; our trainer logs the reason and waits; resolve resumes
it; no group is lost or delivered twice. Real server process, real worker, real HTTP."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from service.client import CuratorClient
from tests.conftest import start_server, stop_server
from tests.service.alerts.helpers import group
from trainer.delivery import lease_batch


@pytest.fixture
def server(fresh_db: str) -> Iterator:
    env = {"GRPO_CURATOR_EMBEDDED_WORKER": "true", "GRPO_CURATOR_ALERT_RETRY_AFTER_S": "1"}
    s = start_server(fresh_db, env=env)
    yield s
    stop_server(s)


def _wait_ready(http: httpx.Client, ids: list[str], timeout_s: float = 120, ok: frozenset = frozenset({"ready"})) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        statuses = {http.get(f"/v1/groups/{i}").json()["status"] for i in ids}
        if statuses <= ok:
            return
        time.sleep(0.2)
    raise AssertionError(f"groups not ready: {statuses}")


def _collapse_entropy(http: httpx.Client) -> dict:
    for v in range(1, 24):
        r = http.post("/v1/policy", json={"version": v, "metrics": {"entropy": 1.0 if v <= 20 else 0.0}})
        assert r.status_code == 201, r.text
    changes = http.post("/v1/alerts/evaluate").json()["transitions"]
    [change] = [c for c in changes if c["alert"]["monitor"] == "entropy_collapse"]
    assert change["to"] == "critical"
    return change["alert"]


def test_breaker_pauses_leasing_and_resolve_resumes_without_loss_or_duplicates(server, caplog):
    http = httpx.Client(base_url=server.url, timeout=30)
    r = http.put("/v1/monitors/entropy_collapse", json={"dataset": None, "warning": 0.5, "critical": 0.8,
                                                        "action": "pause_leases"})
    assert r.status_code == 200, r.text
    alert = _collapse_entropy(http)
    ids = [f"g-{i}" for i in range(4)]
    for i, gid in enumerate(ids):  # producers post while paused
        assert http.post("/v1/groups", json=group(gid, 23, ["42", "7"], prompt_id=f"p-{i}")).status_code in (200, 201)
    _wait_ready(http, ids)

    r = http.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 100})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    body = r.json()
    assert body["detail"]["alert"]["id"] == alert["id"] and "entropy_collapse" in body["error"]
    assert body["detail"]["alert"]["state"] == "critical"

    # our trainer: logs the reason and waits (no crash, no lease) until the admin resolves the alert
    waits: list[float] = []
    got: dict = {}

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        time.sleep(seconds)

    def trainer() -> None:
        with CuratorClient(server.url, unavailable_retries=0) as c:
            got["batch"] = lease_batch(c, "t", max_groups=100, sleep=sleep)

    with caplog.at_level(logging.WARNING, logger="trainer.delivery"):
        t = threading.Thread(target=trainer)
        t.start()
        deadline = time.monotonic() + 60
        while len(waits) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(waits) >= 2 and "batch" not in got  # still waiting, still paused
        http.post("/v1/groups", json=group("g-late", 23, ["42", "1"], prompt_id="p-late"))  # ingest goes on
        r = http.post(f"/v1/alerts/{alert['id']}/resolve")
        assert r.status_code == 200 and r.json()["state"] == "resolved"
        t.join(timeout=60)
    assert not t.is_alive()
    assert any("leasing paused" in rec.getMessage() and alert["id"] in rec.getMessage() for rec in caplog.records)

    delivered = [g["id"] for g in got["batch"]["groups"]]
    _wait_ready(http, ["g-late"], ok=frozenset({"ready", "leased"}))  # scored; maybe in the trainer's batch
    r = http.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 100})
    assert r.status_code in (200, 204), r.text
    delivered += [g["id"] for g in r.json()["groups"]] if r.status_code == 200 else []
    assert http.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 100}).status_code == 204
    assert sorted(delivered) == sorted([*ids, "g-late"])  # every group, once
    http.close()


def test_a_notify_alert_does_not_pause(server):
    http = httpx.Client(base_url=server.url, timeout=30)
    _collapse_entropy(http)  # action notify (the default)
    assert http.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 1}).status_code == 204
    http.close()


def test_a_dataset_pause_stops_leases_that_could_hold_that_dataset_only(api):
    from service.alerts.service import LeasesPaused, check_leasing
    from service.store.models import Alert, MonitorSetting

    # setup: a critical error_rate alert on dataset "toy" whose monitor pauses leases for "toy"
    with api.factory.begin() as s:
        s.add(MonitorSetting(monitor="error_rate", scope="toy", warning=0.05, critical=0.2, action="pause_leases"))
        s.add(Alert(id="a1", monitor="error_rate", dataset="toy", state="critical", opened_version=3, version=3,
                    value=0.5, threshold=0.2, evidence={}))
    with api.factory() as s:
        check_leasing(s, ["math"])  # a key scoped to other datasets only: not paused
        for datasets in (None, ["toy"], ["math", "toy"]):
            with pytest.raises(LeasesPaused) as err:
                check_leasing(s, datasets, retry_after_s=7)
            assert err.value.headers == {"Retry-After": "7"} and err.value.detail["alert"]["id"] == "a1"
            assert not s.in_transaction()  # released: a long poll after the check holds no connection
    with api.factory.begin() as s:
        s.add(Alert(id="a2", monitor="kl_spike", dataset=None, state="critical", opened_version=3, version=3,
                    value=20.0, threshold=10.0, evidence={}))
    with api.factory() as s:
        check_leasing(s, ["math"])  # kl_spike's action is notify (the default): still not paused
