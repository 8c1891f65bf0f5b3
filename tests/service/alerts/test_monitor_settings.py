"""Monitor settings: partial PUTs inherit / keep, a change that lifts an active pause leaves a transition
row, DELETE removes a setting, thresholds are validated, a scoped key reads only its datasets' alerts and
settings, and ``scope: per_dataset`` keeps an overall alert from pausing clean datasets. Real API, real DB."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from service.alerts.service import LeasesPaused, check_leasing
from service.auth import keys
from service.store.models import Alert, AlertTransition, MonitorSetting
from tests.helpers import assert_client_error


def _critical(api, alert_id: str, monitor: str, dataset: str | None) -> None:
    with api.factory.begin() as s:
        s.add(Alert(id=alert_id, monitor=monitor, dataset=dataset, state="critical", opened_version=3, version=3,
                    value=0.5, threshold=0.2, evidence={}))


def _monitor(api, name: str, dataset: str | None = None) -> dict:
    return next(m for m in api.get("/v1/monitors").json()["monitors"] if m["monitor"] == name and m["dataset"] == dataset)


def _paused(api, datasets) -> bool:
    with api.factory() as s:
        try:
            check_leasing(s, datasets)
        except LeasesPaused:
            return True
    return False


def test_a_put_without_action_keeps_the_pause_and_a_lift_is_recorded(api):
    assert api.put("/v1/monitors/error_rate", json={"action": "pause_leases"}).status_code == 200
    assert (_monitor(api, "error_rate")["warning"], _monitor(api, "error_rate")["critical"]) == (0.05, 0.2)  # inherited
    _critical(api, "a1", "error_rate", None)
    r = api.put("/v1/monitors/error_rate", json={"warning": 0.1, "critical": 0.3})  # thresholds only
    assert r.status_code == 200 and r.json()["action"] == "pause_leases"
    assert _paused(api, None)
    # a dataset's own thresholds do not lift the overall pause for that dataset either
    r = api.put("/v1/monitors/error_rate", json={"dataset": "toy", "warning": 0.2, "critical": 0.5})
    assert r.status_code == 200 and r.json()["action"] == "pause_leases" and r.json()["warning"] == 0.2
    assert _paused(api, ["toy"])
    with api.factory() as s:
        assert s.execute(select(AlertTransition).where(AlertTransition.alert_id == "a1")).first() is None
    r = api.put("/v1/monitors/error_rate", json={"action": "notify"})  # the explicit lift
    assert r.status_code == 200 and not _paused(api, None)
    with api.factory() as s:
        [t] = s.execute(select(AlertTransition).where(AlertTransition.alert_id == "a1")).scalars()
        assert (t.from_state, t.to_state) == ("critical", "critical")
        assert t.reason.startswith("admin:") and "action=notify" in t.reason and "lifted the pause" in t.reason


def test_delete_removes_a_setting_and_a_lift_by_delete_is_recorded(api):
    assert api.put("/v1/monitors/error_rate", json={"dataset": "toy", "action": "pause_leases"}).status_code == 200
    _critical(api, "a2", "error_rate", "toy")
    assert _paused(api, ["toy"]) and not _paused(api, ["math"])
    assert api.delete("/v1/monitors/error_rate", params={"dataset": "math"}).status_code == 404
    r = api.delete("/v1/monitors/error_rate", params={"dataset": "toy"})
    assert r.status_code == 200 and r.json()["action"] == "notify"
    assert not _paused(api, ["toy"])
    with api.factory() as s:
        assert s.get(MonitorSetting, ("error_rate", "toy")) is None
        [t] = s.execute(select(AlertTransition).where(AlertTransition.alert_id == "a2")).scalars()
        assert "DELETE" in t.reason


@pytest.mark.parametrize(("body", "field"), [
    ({"warning": -1, "critical": 2}, "warning"),
    ({"warning": 0, "critical": 2}, "warning"),  # a warning of 0 could never resolve
    ({"critical": -0.5}, "critical"),
    ({"critical": 0.01}, "warning"),  # below the inherited warning 0.05
    ({"dataset": "toy"}, "warning"),  # nothing to set
    ({"dataset": "toy", "scope": "per_dataset"}, "scope"),
    ({"warning": "nan"}, "warning"),
])
def test_bad_monitor_settings_are_422_naming_the_field_and_store_nothing(api, body, field):
    assert_client_error(api.put("/v1/monitors/error_rate", json=body), field)
    with api.factory() as s:
        assert s.execute(select(MonitorSetting)).first() is None


def test_trainer_series_monitors_take_no_per_dataset_setting(api):
    assert_client_error(api.put("/v1/monitors/kl_spike", json={"dataset": "toy", "warning": 7}), "dataset")
    assert api.put("/v1/monitors/kl_spike", json={"warning": 7}).status_code == 200


def test_an_overall_change_that_breaks_a_datasets_order_is_422(api):
    assert api.put("/v1/monitors/error_rate", json={"dataset": "toy", "warning": 0.15}).status_code == 200
    assert_client_error(api.put("/v1/monitors/error_rate", json={"critical": 0.1}), "warning")


def test_per_dataset_scope_pauses_only_the_sick_dataset(api):
    r = api.put("/v1/monitors/error_rate", json={"action": "pause_leases", "scope": "per_dataset"})
    assert r.status_code == 200 and r.json()["scope"] == "per_dataset"
    _critical(api, "o1", "error_rate", None)  # overall, caused by one dataset
    assert not _paused(api, ["clean"]) and not _paused(api, None)
    _critical(api, "d1", "error_rate", "sick")  # the sick dataset's own alert: a dataset never set explicitly
    assert _paused(api, ["sick"]) and _paused(api, None) and not _paused(api, ["clean"])


def test_a_scoped_key_reads_only_its_datasets_alerts_and_settings(api):
    with api.factory.begin() as s:
        admin = keys.create_key(s, "adm", "admin")
        scoped = keys.create_key(s, "tr-a", "trainer", ["ds-a"])
    adm = {"Authorization": f"Bearer {admin}"}
    mine = {"Authorization": f"Bearer {scoped}"}
    for ds in ("ds-a", "ds-b"):
        assert api.put("/v1/monitors/error_rate", json={"dataset": ds, "warning": 0.1}, headers=adm).status_code == 200
        _critical(api, f"al-{ds}", "error_rate", ds)
    _critical(api, "al-all", "stale_rate", None)
    r = api.get("/v1/alerts", headers=mine)
    assert r.status_code == 200 and sorted(a["id"] for a in r.json()["alerts"]) == ["al-all", "al-ds-a"]
    assert api.get("/v1/alerts", params={"dataset": "ds-b"}, headers=mine).status_code == 403
    assert [a["id"] for a in api.get("/v1/alerts", params={"dataset": "ds-a"}, headers=mine).json()["alerts"]] == ["al-ds-a"]
    r = api.get("/v1/monitors", headers=mine)
    assert r.status_code == 200 and {m["dataset"] for m in r.json()["monitors"]} == {None, "ds-a"}
    r = api.get("/v1/alerts", headers=adm)
    assert sorted(a["id"] for a in r.json()["alerts"]) == ["al-all", "al-ds-a", "al-ds-b"]
