"""Alerts and monitors: GET /v1/alerts, POST /v1/alerts/{alert_id}/resolve, POST /v1/alerts/evaluate,
GET /v1/monitors, PUT /v1/monitors/{monitor} (docs/alerts.md)."""

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
from service.auth.service import ADMIN, ANY, TRAINER, VIEWER, KeyDep, allow

router = APIRouter(tags=["alerts"])
Name = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH)]
MONITOR_EXAMPLE = {
    "example": {
        "summary": "pause leasing when rollouts error on gsm8k",
        "value": {"dataset": "gsm8k", "warning": 0.05, "critical": 0.2, "action": "pause_leases"},
    }
}


@router.get("/v1/alerts", response_model=AlertsOut, dependencies=[allow(TRAINER, VIEWER, dataset=ANY)])
def list_alerts(
    session: SessionDep,
    dataset: Annotated[str | None, Query(min_length=1, max_length=MAX_NAME_LENGTH)] = None,
    state: AlertState | None = None,
    monitor: MonitorName | None = None,  # an unknown name is a 422 naming `monitor` (a filter, not a path)
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> AlertsOut:
    return alerts.list_alerts(session, dataset, state, monitor, limit)


@router.post("/v1/alerts/evaluate", response_model=EvaluateOut, dependencies=[allow(ADMIN)])
def evaluate_alerts(session: SessionDep, settings: SettingsDep) -> EvaluateOut:
    return alerts.evaluate(session, settings)


@router.post("/v1/alerts/{alert_id}/resolve", response_model=AlertOut, responses={404: {}, 409: {}},
             dependencies=[allow(ADMIN)])
def resolve_alert(alert_id: Name, session: SessionDep, key: KeyDep) -> AlertOut:
    return alerts.resolve(session, alert_id, key.name)


@router.get("/v1/monitors", response_model=MonitorsOut, dependencies=[allow(TRAINER, VIEWER, dataset=ANY)])
def list_monitors(session: SessionDep) -> MonitorsOut:
    return alerts.list_monitors(session)


@router.put("/v1/monitors/{monitor}", response_model=MonitorOut, responses={404: {}}, dependencies=[allow(ADMIN)])
def set_monitor(
    monitor: Name, body: Annotated[MonitorIn, Body(openapi_examples=MONITOR_EXAMPLE)], session: SessionDep
) -> MonitorOut:
    return alerts.set_monitor(session, monitor, body)
