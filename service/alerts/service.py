"""Training-health alerts (issue 24, docs/alerts.md): evaluate every monitor overall and per dataset,
move alerts through their states (service.alerts.machine, one transition row each), and the lease breaker.

Trainer metrics (entropy, KL, clip fraction, gradient norm, behaviour mismatch) are one series for the
whole run: those monitors are evaluated overall only. The rest are evaluated overall and per dataset.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from filters import monitors
from filters.monitors import MONITOR_NAMES, MONITORS, TRAINER_SERIES, Thresholds
from service.alerts import inputs, machine, notifier
from service.alerts import repository as alert_repo
from service.alerts.schemas import AlertOut, AlertsOut, EvaluateOut, MonitorIn, MonitorOut, MonitorsOut
from service.api.errors import BadRequest, Conflict, NotFound, ServiceError
from service.auth.service import OPEN, Principal
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
    """(monitor, scope) -> a snapshot of its stored setting (not the live row: a later change to the row
    leaves an earlier map as it was)."""
    return {(r.monitor, r.scope): SimpleNamespace(warning=r.warning, critical=r.critical, action=r.action,
                                                  pause_scope=r.pause_scope)
            for r in alert_repo.settings_rows(session)}


def _field(rows: dict[tuple[str, str], Any], monitor: str, dataset: str | None, name: str, default: Any) -> Any:
    """One field of the effective setting: the dataset's own value, else the overall one, else ``default``
    (field by field: a dataset that sets only its thresholds inherits the overall action)."""
    for scope in ((dataset, OVERALL) if dataset else (OVERALL,)):
        row = rows.get((monitor, scope))
        if row is not None and getattr(row, name) is not None:
            return getattr(row, name)
    return default


def effective(rows: dict[tuple[str, str], Any], monitor: str, dataset: str | None) -> tuple[Thresholds, str]:
    """(thresholds, action) of ``monitor`` in a scope, field by field (``_field``)."""
    spec = MONITORS[monitor]
    return (Thresholds(_field(rows, monitor, dataset, "warning", spec.warning),
                       _field(rows, monitor, dataset, "critical", spec.critical)),
            _field(rows, monitor, dataset, "action", "notify"))


def pause_scope(rows: dict[tuple[str, str], Any], monitor: str) -> str:
    row = rows.get((monitor, OVERALL))
    return (row.pause_scope if row is not None else None) or "all"


def pauses(rows: dict[tuple[str, str], Any], alert: Alert) -> bool:
    """Whether a critical ``alert`` pauses leasing: its scope's action is pause_leases, and an overall alert
    only while the monitor's pause scope is ``all`` (``per_dataset``: each dataset's own alert pauses it)."""
    if effective(rows, alert.monitor, alert.dataset)[1] != "pause_leases":
        return False
    return alert.dataset is not None or pause_scope(rows, alert.monitor) == "all"


def _monitor_out(monitor: str, dataset: str | None, rows: dict) -> MonitorOut:
    t, action = effective(rows, monitor, dataset)
    spec = MONITORS[monitor]
    return MonitorOut(monitor=monitor, dataset=dataset, warning=t.warning, critical=t.critical, action=action,  # type: ignore[arg-type]
                      scope=pause_scope(rows, monitor), default_warning=spec.warning,  # type: ignore[arg-type]
                      default_critical=spec.critical, source=spec.source)


def list_monitors(session: Session, key: Principal = OPEN) -> MonitorsOut:
    """Every monitor's overall effective settings, then each dataset that has its own (a scoped key sees
    only its datasets' own settings)."""
    rows = _settings_map(session)
    out = [_monitor_out(m, None, rows) for m in MONITOR_NAMES]
    out += [_monitor_out(m, scope, rows) for (m, scope) in sorted(rows)
            if scope != OVERALL and key.allows_dataset(scope)]
    return MonitorsOut(monitors=out)


def _ordered(rows: dict, monitor: str, dataset: str | None) -> None:
    spec = MONITORS[monitor]
    warning = _field(rows, monitor, dataset, "warning", spec.warning)
    critical = _field(rows, monitor, dataset, "critical", spec.critical)
    if warning > critical:
        where = "overall" if dataset is None else f"for dataset {dataset!r}"
        raise BadRequest(f"warning: {warning} is above critical {critical} ({monitor} {where}, with the "
                         "values it inherits)")


def _lift_notes(session: Session, before: dict, after: dict, monitor: str, by: str | None, what: str) -> None:
    """A settings change that lifts an active pause leaves a transition row on each alert it stops
    pausing (critical -> critical, the reason naming who and what), and a notification."""
    changes = []
    for alert in alert_repo.critical_alerts(session):
        if alert.monitor == monitor and pauses(before, alert) and not pauses(after, alert):
            reason = f"admin:{by or 'open'}: {what} lifted the pause"
            version = policy.current_version(session)
            pk = alert_repo.add_transition(session, alert_id=alert.id, from_state="critical", to_state="critical",
                                           version=version, value=alert.value, reason=reason,
                                           notified_at=_outbox_mark(session))
            changes.append(_change(pk, alert, "critical", "critical", version, reason))
    if changes:
        log.warning("alerts: %s", "; ".join(c["reason"] for c in changes))


def set_monitor(session: Session, monitor: str, body: MonitorIn, by: str | None = None) -> MonitorOut:
    _check(monitor)
    if body.dataset is not None and MONITORS[monitor].series in TRAINER_SERIES:
        raise BadRequest(f"dataset: {monitor} reads the trainer's metrics, one series for the whole run, and is "
                         "evaluated overall only; set it with dataset null")
    alert_repo.lock_alerts(session)
    before = _settings_map(session)
    fields = {k: v for k, v in (("warning", body.warning), ("critical", body.critical), ("action", body.action),
                                ("pause_scope", body.scope)) if v is not None}
    alert_repo.upsert_setting(session, monitor, body.dataset or OVERALL, fields)
    after = _settings_map(session)
    _ordered(after, monitor, body.dataset)
    if body.dataset is None:
        for (m, scope) in after:
            if m == monitor and scope != OVERALL:
                _ordered(after, monitor, scope)
    what = f"PUT /v1/monitors/{monitor} " + ", ".join(f"{k}={v}" for k, v in fields.items())
    _lift_notes(session, before, after, monitor, by, what)
    return _monitor_out(monitor, body.dataset, after)


def delete_monitor(session: Session, monitor: str, dataset: str | None, by: str | None = None) -> MonitorOut:
    """Remove a setting: that scope inherits again (the defaults, for the overall one)."""
    _check(monitor)
    alert_repo.lock_alerts(session)
    before = _settings_map(session)
    if not alert_repo.delete_setting(session, monitor, dataset or OVERALL):
        raise NotFound(f"dataset: {monitor} has no setting {'overall' if dataset is None else f'for {dataset!r}'}")
    after = _settings_map(session)
    for (m, scope) in after:
        if m == monitor:
            _ordered(after, monitor, scope or None)
    _lift_notes(session, before, after, monitor, by, f"DELETE /v1/monitors/{monitor}?dataset={dataset or ''}")
    return _monitor_out(monitor, dataset, after)


# -- alerts --------------------------------------------------------------------------------------------
def list_alerts(session: Session, dataset: str | None, state: str | None, monitor: str | None,
                limit: int = 1000, key: Principal = OPEN) -> AlertsOut:
    """A scoped key names only its own datasets (403) and sees their alerts and the overall ones."""
    if monitor is not None:
        _check(monitor)
    if dataset is not None:
        key.check_dataset(dataset, "dataset")
    scoped = None if key.datasets is None else sorted(key.datasets)
    return AlertsOut(alerts=[_out(a) for a in alert_repo.list_alerts(session, dataset, state, monitor, limit, scoped)])


def _change(pk: int, alert: Alert, before: str, to: str, version: int, reason: str) -> dict[str, Any]:
    return {"alert": _out(alert).model_dump(), "from": before, "to": to, "version": version, "reason": reason,
            "transition_id": pk}


def _outbox_mark(session: Session) -> Any:
    return notifier.pending_mark()


def _transition(session: Session, alert: Alert, to: str, version: int, reason: str,
                value: float | None = None) -> dict[str, Any]:
    """Move ``alert`` and store the transition row (in the webhook outbox); ``value``: the row's value
    (the alert's own when None and the monitor moved it)."""
    before = alert.state
    alert.state, alert.version = to, version
    alert.since = _now(session)
    pk = alert_repo.add_transition(session, alert_id=alert.id, from_state=before, to_state=to, version=version,
                                   value=alert.value if value is None and reason == "monitor" else value,
                                   reason=reason, notified_at=_outbox_mark(session))
    return _change(pk, alert, before, to, version, reason)


def _now(session: Session) -> Any:
    return session.execute(select(func.clock_timestamp())).scalar_one()


def resolve(session: Session, alert_id: str, by: str | None) -> AlertOut:
    alert_repo.lock_alerts(session)
    alert = alert_repo.get_alert(session, alert_id, lock=True)
    if alert is None:
        raise NotFound(f"alert_id: no alert {alert_id!r}")
    if alert.state == "resolved":
        raise Conflict(f"alert_id: alert {alert_id!r} is already resolved")
    _transition(session, alert, "resolved", policy.current_version(session), f"admin:{by or 'open'}")
    _export(session, [])
    return _out(alert)


def _evidence(versions: tuple[int, ...], result: monitors.MonitorResult) -> dict[str, Any]:
    def r(v: Any) -> Any:
        return None if v is None else round(float(v), _ROUND)

    def each(vs: Any) -> Any:  # a series (list) or one number (e.g. entropy_level)
        return [r(v) for v in vs] if isinstance(vs, list | tuple) else r(vs)

    return {"versions": list(versions), **{k: each(vs) for k, vs in result.evidence.items()}}


def _scopes(window: Any) -> list[tuple[str | None, list]]:
    every = [g for gs in window.groups.values() for g in gs]
    return [(None, every), *((d, window.groups[d]) for d in sorted(window.groups))]


def _new_values(versions: tuple[int, ...], series: dict, name: str, last: int | None) -> int:
    """How many of the monitor's values are at versions after the last evaluation (at least 1: the same
    version evaluated again scores its last value again, and changes nothing)."""
    if last is None:
        return 1
    values = series.get(MONITORS[name].series, ())
    return max(1, sum(1 for v, x in zip(versions, values, strict=False)
                      if v > last and x is not None and math.isfinite(x)))


@dataclass(frozen=True)
class _Reading:
    """What an evaluation read: the version, the window's rows, the settings and the evaluation cursor."""

    as_of: int
    rows: inputs.WindowRows
    settings: dict[tuple[str, str], Any]
    last: int | None


@dataclass(frozen=True)
class _Score:
    monitor: str
    dataset: str | None
    thresholds: Thresholds
    result: monitors.MonitorResult


class _Moved(Exception):
    """The version, the settings or the cursor changed between an evaluation's read and its write."""


def _read(session: Session, settings: Settings) -> _Reading:
    rows = inputs.read_window(session, settings.alert_window_versions)
    return _Reading(rows.as_of, rows, _settings_map(session), alert_repo.peek_scored_since(session, rows.as_of))


# one StatsCache per scope (None: every dataset together): consecutive evaluations share all but the newest
# versions of their window, whose stats are then not computed again. Keyed by the facts themselves, so
# apps and databases in one process cannot read each other's stale entries.
_stats_caches: dict[str | None, monitors.StatsCache] = {}


def _score(reading: _Reading) -> tuple[tuple[int, ...], list[str], list[_Score]]:
    """Every monitor in every scope (pure Python: no transaction needed)."""
    window = inputs.build(reading.rows)
    scopes = _scopes(window)
    for gone in set(_stats_caches) - {d for d, _ in scopes}:  # datasets that left the window
        _stats_caches.pop(gone, None)
    scores = []
    for dataset, groups in scopes:
        stats = monitors.summarize(groups, _stats_caches.setdefault(dataset, monitors.StatsCache()))
        # a dataset's scope reads no trainer series (those monitors are evaluated overall only)
        series = monitors.window_series(window.versions, stats, window.metrics if dataset is None else {})
        for name in MONITOR_NAMES:
            if dataset is not None and MONITORS[name].series in TRAINER_SERIES:
                continue
            thresholds, _ = effective(reading.settings, name, dataset)
            result = monitors.evaluate(name, series, thresholds,
                                       _new_values(window.versions, series, name, reading.last))
            scores.append(_Score(name, dataset, thresholds, result))
    return window.versions, sorted(window.groups), scores


def _apply(session: Session, settings: Settings, reading: _Reading, versions: tuple[int, ...],
           datasets: list[str], scores: list[_Score], *, locked_since_read: bool = False) -> EvaluateOut:
    """Move the alerts (the caller holds ``lock_alerts``). Raises _Moved, changing nothing, when what the
    scores were computed from is no longer current. ``locked_since_read``: the caller read ``reading`` in this
    transaction under the lock it still holds, and moved the cursor then (``evaluate``): every writer of the
    settings and of the cursor takes that lock, so neither can have moved, and a version published since
    does not make the reading stale (it is the evaluation as of ``reading.as_of``; the next one starts there)."""
    as_of = reading.as_of
    if not locked_since_read and (policy.current_version(session) != as_of
                                  or _settings_map(session) != reading.settings
                                  or alert_repo.scored_since(session, as_of) != reading.last):
        raise _Moved
    rule = machine.Policy(settings.alert_resolve_ratio, settings.alert_cooldown_versions, settings.alert_auto_resolve)
    open_ = {(a.monitor, a.dataset): a for a in alert_repo.open_alerts(session)}
    resolved: dict[tuple[str, str | None], int] | None = None  # read once a monitor with no open alert fires
    changes: list[dict[str, Any]] = []
    for sc in scores:
        name, dataset, thresholds, result = sc.monitor, sc.dataset, sc.thresholds, sc.result
        alert = open_.get((name, dataset))
        cooling = False  # only an alert about to open asks (machine.step)
        if alert is None and result.state != "ok":
            resolved = alert_repo.last_resolved_versions(session) if resolved is None else resolved
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
        alert.evidence = _evidence(versions, result)
        changes.append(_transition(session, alert, to, as_of, "monitor"))
        open_[(name, dataset)] = alert
    # the open alerts now: those locked above and those just opened, in the states just set (the lock
    # keeps every other writer out), so the gauge needs no second read
    _export(session, datasets, [a for a in open_.values() if a.state in alert_repo.OPEN_STATES])
    return EvaluateOut(version=as_of, transitions=changes)


def evaluate(session: Session, settings: Settings | None = None) -> EvaluateOut:
    """Evaluate every monitor at the current policy version and store the transitions it causes, in the
    caller's one transaction (``POST /v1/alerts/evaluate``; the worker uses ``evaluate_in_steps``)."""
    settings = settings or get_settings()
    alert_repo.lock_alerts(session)
    rows = inputs.read_window(session, settings.alert_window_versions)
    reading = _Reading(rows.as_of, rows, _settings_map(session), alert_repo.scored_since(session, rows.as_of))
    return _apply(session, settings, reading, *_score(reading), locked_since_read=True)


def evaluate_in_steps(factory: sessionmaker[Session], settings: Settings | None = None,
                      attempts: int = 3) -> EvaluateOut | None:
    """``evaluate`` without holding a transaction through its Python work: read the window (one short
    transaction), score it (no transaction), then move the alerts in a second short transaction that
    re-checks the version, the settings and the cursor the scores came from (changed: read again, at most
    ``attempts`` times; None when it kept changing). A worker's connections end a transaction left idle longer
    than ``worker_idle_in_transaction_s`` (service.store.db.worker_options); scoring a large window takes
    longer than that."""
    settings = settings or get_settings()
    for _ in range(attempts):
        with factory.begin() as session:
            reading = _read(session, settings)
        scored = _score(reading)
        try:
            with factory.begin() as session:
                alert_repo.lock_alerts(session)
                return _apply(session, settings, reading, *scored)
        except _Moved:
            log.info("alerts: the version, settings or cursor moved during an evaluation; reading again")
    log.warning("alerts: evaluation skipped: what it read kept changing (%d attempts)", attempts)
    return None


def _export(session: Session, datasets: list[str], open_alerts: list[Alert] | None = None) -> None:
    """The Prometheus gauge: every monitor overall and per dataset of the window, from the stored alerts
    (``open_alerts``: those in warning / critical, when the caller knows them)."""
    states = {(m, OVERALL): "ok" for m in MONITOR_NAMES}
    states |= {(m, d): "ok" for d in datasets for m in MONITOR_NAMES if MONITORS[m].series not in TRAINER_SERIES}
    for a in alert_repo.open_alerts(session) if open_alerts is None else open_alerts:
        states[(a.monitor, a.dataset or OVERALL)] = a.state
    set_monitor_states(states)


_last_run = [0.0]


def evaluate_due(session: Session) -> None:
    """The worker's scheduled evaluation: at most once per ``alert_evaluate_seconds`` per process.

    ``session`` gives the engine only: the outbox delivery and the evaluation's steps each run in their own
    short transaction (``evaluate_in_steps``), so the caller's transaction never starts and is never left idle
    while the monitors are scored."""
    settings = get_settings()
    factory = sessionmaker(session.get_bind(), expire_on_commit=False, autoflush=False)
    with factory.begin() as own:
        notifier.deliver_due(own, settings)  # the webhook outbox, every pass
    if time.monotonic() - _last_run[0] < settings.alert_evaluate_seconds:
        return
    _last_run[0] = time.monotonic()
    out = evaluate_in_steps(factory, settings)
    changes = out.transitions if out is not None else []
    if changes:
        log.warning("alerts: %s", "; ".join(f"{c['alert']['monitor']} {c['from']} -> {c['to']}" for c in changes))


# -- the breaker -----------------------------------------------------------------------------------------
def raise_if_paused(session: Session, key_datasets: list[str] | None, retry_after_s: float | None = None) -> None:
    """Raise LeasesPaused (503) while a pause_leases monitor is critical for every dataset, or for a dataset
    this lease could hold (a key scoped to other datasets only is not paused). Reads in the caller's
    transaction (``service.delivery.lease_once`` checks again right before it claims groups, so a long poll
    woken by a group posted during a pause is answered 503, not leased)."""
    criticals = alert_repo.critical_alerts(session)
    rows = _settings_map(session) if criticals else {}
    for alert in criticals:
        if not pauses(rows, alert):
            continue
        if alert.dataset is None or key_datasets is None or alert.dataset in key_datasets:
            raise LeasesPaused(_out(alert), retry_after_s or get_settings().alert_retry_after_s)


def check_leasing(session: Session, key_datasets: list[str] | None, retry_after_s: float | None = None) -> None:
    """``raise_if_paused`` before a lease starts waiting.

    A read only; its transaction is rolled back before returning, so a long poll that follows waits
    holding no connection (service.delivery.ready)."""
    try:
        raise_if_paused(session, key_datasets, retry_after_s)
    finally:
        session.rollback()
