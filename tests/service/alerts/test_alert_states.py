"""Alerts as durable state: ok -> warning -> critical -> resolved, every transition a row; the routes."""

from __future__ import annotations

from sqlalchemy import select

from service.store.models import AlertTransition
from tests.helpers import assert_client_error
from tests.service.alerts.helpers import evaluate, opened, publish


def test_entropy_collapse_opens_escalates_and_resolves_with_a_row_each(api):
    for v in range(1, 21):
        publish(api, v, entropy=1.0)
        assert evaluate(api) == []
    publish(api, 21, entropy=0.1)  # recent (1, 1, 0.1) / 3 = 0.7 -> drop 0.3: ok
    assert evaluate(api) == []
    publish(api, 22, entropy=0.1)  # drop 0.6: warning
    assert opened(evaluate(api)) == {("entropy_collapse", None, "warning")}
    assert evaluate(api) == []  # the same version again changes nothing
    publish(api, 23, entropy=0.1)  # drop 0.9: critical
    assert opened(evaluate(api)) == {("entropy_collapse", None, "critical")}
    [alert] = api.get("/v1/alerts", params={"monitor": "entropy_collapse"}).json()["alerts"]
    assert alert["state"] == "critical" and alert["dataset"] is None
    assert alert["value"] == 0.9 or abs(alert["value"] - 0.9) < 1e-9
    assert alert["threshold"] == 0.8 and alert["evidence"]["entropy"][-1] == 0.1
    assert alert["evidence"]["versions"][-1] == 23
    changes = {}
    for v in range(24, 27):  # recovers: at 25 recent (0.1, 1, 1) -> drop 0.3 < 0.5 * 0.8: resolved by itself
        publish(api, v, entropy=1.0)
        changes[v] = opened(evaluate(api))
    assert changes == {24: set(), 25: {("entropy_collapse", None, "resolved")}, 26: set()}
    with api.factory() as s:
        rows = s.execute(select(AlertTransition.from_state, AlertTransition.to_state).order_by(AlertTransition.pk)).all()
    assert [tuple(r) for r in rows] == [("ok", "warning"), ("warning", "critical"), ("critical", "resolved")]
    assert api.get("/v1/alerts", params={"state": "resolved"}).json()["alerts"][0]["id"] == alert["id"]
    assert api.get("/v1/alerts", params={"state": "critical"}).json()["alerts"] == []


def test_cooldown_keeps_a_resolved_monitor_quiet_for_some_versions(api):
    for v in range(1, 21):
        publish(api, v, entropy=1.0)
    publish(api, 21, entropy=0.0)
    publish(api, 22, entropy=0.0)
    publish(api, 23, entropy=0.0)
    [change] = evaluate(api)
    r = api.post(f"/v1/alerts/{change['alert']['id']}/resolve")
    assert r.status_code == 200 and r.json()["state"] == "resolved"
    assert api.post(f"/v1/alerts/{change['alert']['id']}/resolve").status_code == 409
    for v in range(24, 28):  # still collapsed, but within the 5-version cooldown of the resolve at 23
        publish(api, v, entropy=0.0)
        assert evaluate(api) == []
    publish(api, 28, entropy=0.0)
    assert opened(evaluate(api)) == {("entropy_collapse", None, "critical")}


def test_monitor_settings_are_validated_listed_and_used(api):
    monitors = api.get("/v1/monitors").json()["monitors"]
    assert {m["monitor"] for m in monitors} >= {"entropy_collapse", "error_rate", "stale_rate"}
    err = next(m for m in monitors if m["monitor"] == "error_rate")
    assert (err["warning"], err["critical"], err["action"], err["dataset"]) == (0.05, 0.2, "notify", None)
    assert "prime-rl" in err["source"]
    assert api.put("/v1/monitors/nope", json={"warning": 1, "critical": 2}).status_code == 404
    assert_client_error(api.put("/v1/monitors/error_rate", json={"warning": 3, "critical": 2}), "warning")
    assert_client_error(api.put("/v1/monitors/error_rate", json={"warning": 1, "critical": 2, "action": "x"}), "action")
    r = api.put("/v1/monitors/error_rate", json={"dataset": "toy", "warning": 0.1, "critical": 0.5, "action": "pause_leases"})
    assert r.status_code == 200 and r.json()["action"] == "pause_leases"
    listed = [m for m in api.get("/v1/monitors").json()["monitors"] if m["monitor"] == "error_rate"]
    assert [(m["dataset"], m["warning"]) for m in listed] == [(None, 0.05), ("toy", 0.1)]
    assert_client_error(api.get("/v1/alerts", params={"state": "open"}), "state")
    assert_client_error(api.get("/v1/alerts", params={"monitor": "nope"}), "monitor")  # a filter: 422, not 404


# Attack: trainer metrics are free-form JSON numbers; extreme finite ones must not make GET /v1/alerts a 500
def test_extreme_trainer_metrics_give_a_readable_alert(api):
    for v in range(1, 12):
        publish(api, v, kl_ref=1.7e308 if v % 2 else 0.02, grad_norm=1.0)
    publish(api, 12, kl_ref=1.7e308, grad_norm=1.7e308)
    assert ("grad_norm_spike", None, "critical") in opened(evaluate(api))
    r = api.get("/v1/alerts")
    assert r.status_code == 200
    alerts = {a["monitor"]: a for a in r.json()["alerts"]}  # a huge value is a huge value, never "no data"
    assert alerts["grad_norm_spike"]["value"] > 1e300 and alerts["grad_norm_spike"]["state"] == "critical"


def test_an_unknown_monitor_in_the_alerts_filter_is_a_422_naming_it(api):
    """Found by the schema fuzzer: the filter answered 404, a status the route does not document."""
    r = api.get("/v1/alerts", params={"monitor": "entropy_colapse"})
    assert r.status_code == 422 and "monitor" in r.text
    assert api.get("/v1/alerts", params={"monitor": "entropy_collapse"}).status_code == 200


def test_a_spike_between_two_evaluations_is_seen(api):
    """The worker evaluates every 30 s; a trainer publishes faster. Every version since the last evaluation
    is scored (alert_cursor), not only the latest."""
    for v in range(1, 31):
        publish(api, v, grad_norm=1.0 + 0.1 * (v % 5))  # median 1.2, MAD 0.1: scale 0.148
    assert not opened(evaluate(api))
    publish(api, 31, grad_norm=10.0)  # z (10 - 1.2) / 0.148 = 59: critical
    publish(api, 32, grad_norm=1.2)
    publish(api, 33, grad_norm=1.2)
    assert ("grad_norm_spike", None, "critical") in opened(evaluate(api))
    assert evaluate(api) == []  # the same version again: nothing changes
    publish(api, 34, grad_norm=1.2)
    assert ("grad_norm_spike", None, "resolved") in opened(evaluate(api))  # only 34 is new: calm
