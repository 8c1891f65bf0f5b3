"""The circuit breaker: while a pause_leases alert is critical, POST /v1/batches/lease answers 503 with
Retry-After and the alert; producers keep posting; our trainer logs the reason and waits; resolve resumes
it; no group is lost or delivered twice. Real server process, real worker, real HTTP: one server for the
module, its tables emptied before each test (``server``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import create_engine, text

from service.client import CuratorClient
from tests.conftest import start_server, stop_server
from tests.service.alerts.helpers import group
from trainer.delivery import lease_batch

_RESET = text(
    "TRUNCATE groups, prompts, trajectories, prompt_prefixes, rewards, decisions, leases, policy_versions,"
    " stats_cells, sampling_requests, agent_sessions, session_calls, group_tombstones,"
    " monitor_settings, alerts, alert_transitions, alert_cursor CASCADE"
)


@pytest.fixture(scope="module")
def shared_server(make_db) -> Iterator:
    """One server (with its score / curate worker) for the module's real-process tests. Its worker's own
    scheduled evaluation is off (``alert_evaluate_seconds`` far away): every transition here comes from the
    tests' POST /v1/alerts/evaluate, which a scheduled one falling between a test's publishes and its
    evaluation would otherwise take away."""
    env = {"GRPO_CURATOR_EMBEDDED_WORKER": "true", "GRPO_CURATOR_ALERT_RETRY_AFTER_S": "1",
           "GRPO_CURATOR_ALERT_EVALUATE_SECONDS": "1e9"}
    s = start_server(make_db(), env=env)
    try:
        yield s
    finally:
        stop_server(s)
        make_db.retire(s.db_url)


@pytest.fixture
def server(shared_server) -> Iterator:
    """The module's server on emptied tables: no groups, leases, published versions, monitor settings
    or alerts (the built-in specs and policies stay): each test starts where a fresh database would."""
    engine = create_engine(shared_server.db_url)
    with engine.begin() as conn:
        conn.execute(_RESET)
    engine.dispose()
    yield shared_server


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


def test_the_client_logs_the_alert_on_the_first_paused_answer_and_keeps_waiting(server, caplog):
    """CuratorClient retries a 503 with Retry-After; a pause (the 503 names an alert) is logged with the alert
    at once, once per alert, not after the retries run out; the call keeps waiting and returns the lease once
    an admin resolves the alert."""
    http = httpx.Client(base_url=server.url, timeout=30)
    r = http.put("/v1/monitors/entropy_collapse", json={"dataset": None, "warning": 0.5, "critical": 0.8,
                                                        "action": "pause_leases"})
    assert r.status_code == 200, r.text
    alert = _collapse_entropy(http)
    assert http.post("/v1/groups", json=group("c-0", 23, ["42", "7"], prompt_id="p-c")).status_code in (200, 201)
    _wait_ready(http, ["c-0"])
    got: dict = {}

    def paused_records() -> list[logging.LogRecord]:
        return [rec for rec in caplog.records if "leasing paused" in rec.getMessage()]

    def trainer() -> None:
        with CuratorClient(server.url, unavailable_retries=1000, max_retry_after_s=0.2) as c:
            got["batch"] = c.lease("t", max_groups=10)

    with caplog.at_level(logging.WARNING, logger="service.client"):
        t = threading.Thread(target=trainer)
        t.start()
        deadline = time.monotonic() + 60
        while not paused_records() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "batch" not in got and t.is_alive()  # told, and still waiting: the first 503 was logged
        time.sleep(1.0)  # several more paused answers (0.2 s apart): not logged again
        assert http.post(f"/v1/alerts/{alert['id']}/resolve").status_code == 200
        t.join(timeout=60)
    assert not t.is_alive()
    [rec] = paused_records()
    msg = rec.getMessage()
    assert alert["id"] in msg and "entropy_collapse" in msg and "is critical for every dataset" in msg
    assert [g["id"] for g in got["batch"]["groups"]] == ["c-0"]
    http.close()


def test_a_long_poll_waiting_when_the_pause_starts_is_answered_503_not_leased(server):
    """The pause is checked again when a waiting poll wakes: a group posted during the pause wakes it, and it
    answers 503 with Retry-After and the alert instead of delivering the group (real long poll)."""
    http = httpx.Client(base_url=server.url, timeout=60)
    r = http.put("/v1/monitors/entropy_collapse", json={"warning": 0.5, "critical": 0.8, "action": "pause_leases"})
    assert r.status_code == 200, r.text
    got: dict = {}

    def poll() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            got["r"] = c.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10, "wait_seconds": 40})

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(1.0)  # the poll passed its first check (no alert yet) and waits
    alert = _collapse_entropy(http)
    assert t.is_alive()
    assert http.post("/v1/groups", json=group("lp-0", 23, ["42", "7"], prompt_id="p-lp")).status_code in (200, 201)
    t.join(timeout=60)
    assert not t.is_alive()
    r = got["r"]
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"] == "1" and r.json()["detail"]["alert"]["id"] == alert["id"]
    assert http.get("/v1/groups/lp-0").json()["status"] != "leased"  # nothing delivered while paused
    assert http.post(f"/v1/alerts/{alert['id']}/resolve").status_code == 200
    _wait_ready(http, ["lp-0"])
    r = http.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10})
    assert r.status_code == 200 and [g["id"] for g in r.json()["groups"]] == ["lp-0"]
    http.close()


def test_a_retried_request_id_replays_its_batch_during_a_pause(server):
    http = httpx.Client(base_url=server.url, timeout=30)
    r = http.put("/v1/monitors/entropy_collapse", json={"warning": 0.5, "critical": 0.8, "action": "pause_leases"})
    assert r.status_code == 200, r.text
    assert http.post("/v1/groups", json=group("rp-0", 1, ["42", "7"], prompt_id="p-rp")).status_code in (200, 201)
    _wait_ready(http, ["rp-0"])
    first = http.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10, "request_id": "req-1"})
    assert first.status_code == 200, first.text
    _collapse_entropy(http)
    again = http.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10, "request_id": "req-1"})
    assert again.status_code == 200, again.text
    assert again.json()["stats"]["replayed"] and again.json()["batch_id"] == first.json()["batch_id"]
    fresh = http.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10, "request_id": "req-2"})
    assert fresh.status_code == 503 and fresh.headers["Retry-After"] == "1"
    http.close()


def test_a_max_staleness_lease_refused_during_a_pause_drops_nothing(server):
    """A lease with max_staleness drops the stale groups it can never take; refused while paused (503), it drops
    nothing, with a request_id too (attack, helper-45: with a new request_id the drop was committed before the
    pause was checked, and the groups were gone)."""
    http = httpx.Client(base_url=server.url, timeout=30)
    r = http.put("/v1/monitors/entropy_collapse", json={"warning": 0.5, "critical": 0.8, "action": "pause_leases"})
    assert r.status_code == 200, r.text
    ids = [f"st-{i}" for i in range(3)]
    for gid in ids:
        assert http.post("/v1/groups", json=group(gid, 1, ["42", "7"], prompt_id="p-st")).status_code in (200, 201)
    _wait_ready(http, ids)
    _collapse_entropy(http)  # publishes versions up to 23: the groups (version 1) are past max_staleness 2
    for extra in ({}, {"request_id": "stale-1"}):
        refused = http.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10, "max_staleness": 2, **extra})
        assert refused.status_code == 503, refused.text
        assert {http.get(f"/v1/groups/{i}").json()["status"] for i in ids} == {"ready"}, extra
    http.close()


def test_archiving_keeps_the_groups_the_monitors_read_so_the_breaker_stays(api, fresh_db, tmp_path):
    """The archiver (retention 0s) leaves hot every group inside the monitors' window (current version -
    alert_window_versions and newer): archiving them resolved the stale_rate alert they raised and lifted the
    pause. Groups older than the window do go."""
    from datetime import timedelta

    from sqlalchemy import select, text
    from sqlalchemy.orm import Session

    from service.archive import service as archive
    from service.settings import get_settings
    from service.store.db import get_engine
    from service.store.models import Group
    from tests.helpers import make_group

    window = get_settings().alert_window_versions
    engine = get_engine(fresh_db)
    old = make_group("old-0", prompt_id="p-1", answers=["42", "7"], policy_version=1)
    assert api.post("/v1/groups", json=old).status_code == 201
    last = window + 11
    for v in range(window + 2, last + 1):
        assert api.post("/v1/policy", json={"version": v, "metrics": {}}).status_code == 201
        gs = [make_group(f"g{v}-{i}", prompt_id="p-1", answers=["42", "7"], policy_version=v) for i in range(4)]
        assert api.post("/v1/groups", json={"groups": gs}).status_code == 201
    with Session(engine) as s, s.begin():  # half of every version dropped as stale: a lagging producer
        s.execute(text("UPDATE groups SET status = 'dropped', drop_reason = 'stale' WHERE id ~ '-[01]$'"))
        s.execute(text("UPDATE groups SET status = 'ready' WHERE status = 'received'"))
    assert api.put("/v1/monitors/stale_rate", json={"dataset": None, "action": "pause_leases"}).status_code == 200
    assert ("stale_rate", None, "critical") in {(t["alert"]["monitor"], t["alert"]["dataset"], t["to"])
                                               for t in api.post("/v1/alerts/evaluate").json()["transitions"]}
    assert api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 1}).status_code == 503

    result = archive.archive(engine, str(tmp_path), timedelta(0))
    assert result.groups == 1  # old-0 only: version 1 < last - window
    with Session(engine) as s:
        assert s.execute(select(Group.id).where(Group.id == "old-0")).first() is None
    assert api.post("/v1/alerts/evaluate").json()["transitions"] == []
    critical = api.get("/v1/alerts", params={"state": "critical", "monitor": "stale_rate"}).json()["alerts"]
    assert {a["dataset"] for a in critical} == {None, "toy"}  # overall and the dataset's own, both still open
    assert api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 1}).status_code == 503
