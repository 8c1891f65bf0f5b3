"""Alerts and monitors: GET /v1/alerts, POST /v1/alerts/{alert_id}/resolve, POST /v1/alerts/evaluate,
GET /v1/monitors, PUT /v1/monitors/{monitor}, DELETE /v1/monitors/{monitor}?dataset= (docs/alerts.md).

A dataset-scoped key reads its own datasets' alerts and settings and the overall ones (dataset=SERVICE:
the service filters; naming another dataset is a 403)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query

from filters.monitors import MonitorName
from service.alerts import service as alerts
from service.alerts.schemas import (
    AlertOut,
    AlertsOut,
    AlertState,
    EvaluateOut,
    MonitorIn,
    MonitorOut,
    MonitorsOut,
)
from service.api.deps import SessionDep, SettingsDep
from service.api.schemas import MAX_NAME_LENGTH
from service.auth.service import ADMIN, SERVICE, TRAINER, VIEWER, KeyDep, allow

router = APIRouter(tags=["alerts"])
Name = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH)]
MONITOR_EXAMPLE = {
    "example": {
        "summary": "pause leasing when rollouts error on gsm8k",
        "value": {"dataset": "gsm8k", "warning": 0.05, "critical": 0.2, "action": "pause_leases"},
    }
}


@router.get("/v1/alerts", response_model=AlertsOut, responses={403: {}},
            dependencies=[allow(TRAINER, VIEWER, dataset=SERVICE)])
def list_alerts(
    session: SessionDep,
    key: KeyDep,
    dataset: Annotated[str | None, Query(min_length=1, max_length=MAX_NAME_LENGTH)] = None,
    state: AlertState | None = None,
    monitor: MonitorName | None = None,  # an unknown name is a 422 naming `monitor` (a filter, not a path)
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> AlertsOut:
    return alerts.list_alerts(session, dataset, state, monitor, limit, key)


@router.post("/v1/alerts/evaluate", response_model=EvaluateOut, dependencies=[allow(ADMIN)])
def evaluate_alerts(session: SessionDep, settings: SettingsDep) -> EvaluateOut:
    return alerts.evaluate(session, settings)


@router.post("/v1/alerts/{alert_id}/resolve", response_model=AlertOut, responses={404: {}, 409: {}},
             dependencies=[allow(ADMIN)])
def resolve_alert(alert_id: Name, session: SessionDep, key: KeyDep) -> AlertOut:
    return alerts.resolve(session, alert_id, key.name)


@router.get("/v1/monitors", response_model=MonitorsOut, dependencies=[allow(TRAINER, VIEWER, dataset=SERVICE)])
def list_monitors(session: SessionDep, key: KeyDep) -> MonitorsOut:
    return alerts.list_monitors(session, key)


@router.put("/v1/monitors/{monitor}", response_model=MonitorOut, responses={404: {}}, dependencies=[allow(ADMIN)])
def set_monitor(
    monitor: Name, body: Annotated[MonitorIn, Body(openapi_examples=MONITOR_EXAMPLE)], session: SessionDep,
    key: KeyDep,
) -> MonitorOut:
    return alerts.set_monitor(session, monitor, body, key.name)


@router.delete("/v1/monitors/{monitor}", response_model=MonitorOut, responses={404: {}}, dependencies=[allow(ADMIN)])
def delete_monitor(
    monitor: Name, session: SessionDep, key: KeyDep,
    dataset: Annotated[str | None, Query(min_length=1, max_length=MAX_NAME_LENGTH)] = None,
) -> MonitorOut:
    """Remove a setting: the scope inherits again (a dataset's from the overall one, that from the defaults)."""
    return alerts.delete_monitor(session, monitor, dataset, key.name)
