"""Training-health alerts (issue 24, docs/alerts.md): evaluate every monitor overall and per dataset,
move alerts through their states (service.alerts.machine, one transition row each), and the lease breaker.

Trainer metrics (entropy, KL, clip fraction, gradient norm, behaviour mismatch) are one series for the
whole run: those monitors are evaluated overall only. The rest are evaluated overall and per dataset.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from filters import monitors
from filters.monitors import MONITOR_NAMES, MONITORS, TRAINER_SERIES, Thresholds
from service.alerts import machine
from service.alerts import repository as alert_repo
from service.alerts.inputs import gather
from service.alerts.notifier import notify_after_commit
from service.alerts.schemas import AlertOut, AlertsOut, EvaluateOut, MonitorIn, MonitorOut, MonitorsOut
from service.api.errors import Conflict, NotFound, ServiceError
from service.observability.metrics import set_monitor_states
from service.policy import service as policy
from service.settings import Settings, get_settings
from service.store.models import Alert

log = logging.getLogger(__name__)
OVERALL = ""  # the settings scope of "every dataset together"
_ROUND = 6


class LeasesPaused(ServiceError):
    """503: a pause_leases monitor is critical; the body names the alert, Retry-After says when to ask."""

    status_code = 503

    def __init__(self, alert: AlertOut, retry_after_s: float) -> None:
        scope = "every dataset" if alert.dataset is None else f"dataset {alert.dataset}"
        super().__init__(
            f"leasing paused: monitor {alert.monitor} is critical for {scope} "
            f"(value {alert.value}, threshold {alert.threshold}); an admin resolves it with "
            f"POST /v1/alerts/{alert.id}/resolve",
            detail={"alert": alert.model_dump(), "retry_after_s": retry_after_s},
        )
        self.headers = {"Retry-After": str(max(1, round(retry_after_s)))}


def _check(name: str) -> None:
    if name not in MONITORS:
        raise NotFound(f"monitor: no monitor {name!r}; expected one of {', '.join(MONITOR_NAMES)}")


def _out(a: Alert) -> AlertOut:
    return AlertOut(id=a.id, monitor=a.monitor, dataset=a.dataset, state=a.state, since=a.since.isoformat(),  # type: ignore[arg-type]
                    value=a.value, threshold=a.threshold, evidence=a.evidence)


# -- settings ------------------------------------------------------------------------------------------
def _settings_map(session: Session) -> dict[tuple[str, str], Any]:
    return {(r.monitor, r.scope): r for r in alert_repo.settings_rows(session)}


def effective(rows: dict[tuple[str, str], Any], monitor: str, dataset: str | None) -> tuple[Thresholds, str]:
    """(thresholds, action): the dataset's own setting, else the overall one, else the defaults."""
    row = rows.get((monitor, dataset or OVERALL)) or rows.get((monitor, OVERALL))
    if row is None:
        spec = MONITORS[monitor]
        return Thresholds(spec.warning, spec.critical), "notify"
    return Thresholds(row.warning, row.critical), row.action


def _monitor_out(monitor: str, dataset: str | None, rows: dict) -> MonitorOut:
    t, action = effective(rows, monitor, dataset)
    spec = MONITORS[monitor]
    return MonitorOut(monitor=monitor, dataset=dataset, warning=t.warning, critical=t.critical, action=action,  # type: ignore[arg-type]
                      default_warning=spec.warning, default_critical=spec.critical, source=spec.source)


def list_monitors(session: Session) -> MonitorsOut:
    """Every monitor's overall effective settings, then each dataset that has its own."""
    rows = _settings_map(session)
    out = [_monitor_out(m, None, rows) for m in MONITOR_NAMES]
    out += [_monitor_out(m, scope, rows) for (m, scope) in sorted(rows) if scope != OVERALL]
    return MonitorsOut(monitors=out)


def set_monitor(session: Session, monitor: str, body: MonitorIn) -> MonitorOut:
    _check(monitor)
    alert_repo.upsert_setting(session, monitor, body.dataset or OVERALL, body.warning, body.critical, body.action)
    return _monitor_out(monitor, body.dataset, _settings_map(session))


# -- alerts --------------------------------------------------------------------------------------------
def list_alerts(session: Session, dataset: str | None, state: str | None, monitor: str | None,
                limit: int = 1000) -> AlertsOut:
    if monitor is not None:
        _check(monitor)
    return AlertsOut(alerts=[_out(a) for a in alert_repo.list_alerts(session, dataset, state, monitor, limit)])


def _transition(session: Session, alert: Alert, to: str, version: int, reason: str) -> dict[str, Any]:
    before = alert.state
    alert.state, alert.version = to, version
    alert.since = _now(session)
    alert_repo.add_transition(session, alert_id=alert.id, from_state=before, to_state=to, version=version,
                              value=alert.value, reason=reason)
    return {"alert": _out(alert).model_dump(), "from": before, "to": to, "version": version, "reason": reason}


def _now(session: Session) -> Any:
    return session.execute(select(func.clock_timestamp())).scalar_one()


def resolve(session: Session, alert_id: str, by: str | None) -> AlertOut:
    alert_repo.lock_alerts(session)
    alert = alert_repo.get_alert(session, alert_id, lock=True)
    if alert is None:
        raise NotFound(f"alert_id: no alert {alert_id!r}")
    if alert.state == "resolved":
        raise Conflict(f"alert_id: alert {alert_id!r} is already resolved")
    change = _transition(session, alert, "resolved", policy.current_version(session), f"admin:{by or 'open'}")
    notify_after_commit(session, [change])
    _export(session, [])
    return _out(alert)


def _evidence(versions: tuple[int, ...], result: monitors.MonitorResult) -> dict[str, Any]:
    def r(v: Any) -> Any:
        return None if v is None else round(float(v), _ROUND)

    return {"versions": list(versions), **{k: [r(v) for v in vs] for k, vs in result.evidence.items()}}  # type: ignore[attr-defined]


def _scopes(window: Any) -> list[tuple[str | None, list]]:
    every = [g for gs in window.groups.values() for g in gs]
    return [(None, every), *((d, window.groups[d]) for d in sorted(window.groups))]


def evaluate(session: Session, settings: Settings | None = None) -> EvaluateOut:
    """Evaluate every monitor at the current policy version and store the transitions it causes."""
    settings = settings or get_settings()
    rule = machine.Policy(settings.alert_resolve_ratio, settings.alert_cooldown_versions, settings.alert_auto_resolve)
    alert_repo.lock_alerts(session)
    as_of = policy.current_version(session)
    window = gather(session, as_of, settings.alert_window_versions)
    rows = _settings_map(session)
    open_ = {(a.monitor, a.dataset): a for a in alert_repo.open_alerts(session)}
    resolved = alert_repo.last_resolved_versions(session)
    changes: list[dict[str, Any]] = []
    for dataset, groups in _scopes(window):
        series = monitors.window_series(window.versions, monitors.summarize(groups), window.metrics)
        for name in MONITOR_NAMES:
            if dataset is not None and MONITORS[name].series in TRAINER_SERIES:
                continue
            thresholds, _ = effective(rows, name, dataset)
            result = monitors.evaluate(name, series, thresholds)
            alert = open_.get((name, dataset))
            cooling = machine.cooling(resolved.get((name, dataset)), as_of, rule)
            to = machine.step(alert.state if alert else "ok", result.state, result.value, thresholds.warning, rule, cooling)
            if to is None:
                continue
            if alert is None:
                alert = Alert(id=uuid.uuid4().hex, monitor=name, dataset=dataset, state="ok", opened_version=as_of,
                              version=as_of, evidence={})
                alert_repo.add_alert(session, alert)
            if to != "resolved" or result.value is not None:
                alert.value, alert.threshold = result.value, result.threshold or alert.threshold
            alert.evidence = _evidence(window.versions, result)
            changes.append(_transition(session, alert, to, as_of, "monitor"))
    notify_after_commit(session, changes)
    _export(session, sorted(window.groups))
    return EvaluateOut(version=as_of, transitions=changes)


def _export(session: Session, datasets: list[str]) -> None:
    """The Prometheus gauge: every monitor overall and per dataset of the window, from the stored alerts."""
    states = {(m, OVERALL): "ok" for m in MONITOR_NAMES}
    states |= {(m, d): "ok" for d in datasets for m in MONITOR_NAMES if MONITORS[m].series not in TRAINER_SERIES}
    for a in alert_repo.open_alerts(session):
        states[(a.monitor, a.dataset or OVERALL)] = a.state
    set_monitor_states(states)


_last_run = [0.0]


def evaluate_due(session: Session) -> None:
    """The worker's scheduled evaluation: at most once per ``alert_evaluate_seconds`` per process."""
    settings = get_settings()
    if time.monotonic() - _last_run[0] < settings.alert_evaluate_seconds:
        return
    _last_run[0] = time.monotonic()
    changes = evaluate(session, settings).transitions
    if changes:
        log.warning("alerts: %s", "; ".join(f"{c['alert']['monitor']} {c['from']} -> {c['to']}" for c in changes))


# -- the breaker -----------------------------------------------------------------------------------------
def check_leasing(session: Session, key_datasets: list[str] | None, retry_after_s: float | None = None) -> None:
    """Raise LeasesPaused (503) while a pause_leases monitor is critical for every dataset, or for a dataset
    this lease could hold (a key scoped to other datasets only is not paused).

    A read only; its transaction is rolled back before returning, so a long poll that follows waits
    holding no connection (service.delivery.ready)."""
    try:
        criticals = alert_repo.critical_alerts(session)
        rows = _settings_map(session) if criticals else {}
        for alert in criticals:
            if effective(rows, alert.monitor, alert.dataset)[1] != "pause_leases":
                continue
            if alert.dataset is None or key_datasets is None or alert.dataset in key_datasets:
                raise LeasesPaused(_out(alert), retry_after_s or get_settings().alert_retry_after_s)
    finally:
        session.rollback()
