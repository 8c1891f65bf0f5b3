"""API schemas of alerts and monitors (issue 24 "Contract"; docs/alerts.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from service.api.schemas import ID_PATTERN, MAX_NAME_LENGTH, Strict

AlertState = Literal["warning", "critical", "resolved"]
MonitorAction = Literal["notify", "pause_leases"]


class AlertOut(BaseModel):
    id: str
    monitor: str
    dataset: str | None  # None: every dataset together
    state: AlertState
    since: str  # the time of its last transition
    value: float | None
    threshold: float | None
    evidence: dict[str, Any]  # the window the monitor read: versions and series


class AlertsOut(BaseModel):
    alerts: list[AlertOut]


class MonitorIn(Strict):
    """``PUT /v1/monitors/{monitor}``: thresholds and action, overall (dataset null) or for one dataset."""

    dataset: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH, pattern=ID_PATTERN)
    warning: float = Field(allow_inf_nan=False)
    critical: float = Field(allow_inf_nan=False)
    action: MonitorAction = "notify"

    @model_validator(mode="after")
    def _ordered(self) -> MonitorIn:
        if self.warning > self.critical:
            raise ValueError(f"warning: {self.warning} is above critical {self.critical}")
        return self


class MonitorOut(BaseModel):
    monitor: str
    dataset: str | None
    warning: float
    critical: float
    action: MonitorAction
    default_warning: float
    default_critical: float
    source: str  # where the default thresholds come from


class MonitorsOut(BaseModel):
    monitors: list[MonitorOut]


class EvaluateOut(BaseModel):
    version: int  # the policy version the monitors were evaluated at
    transitions: list[dict[str, Any]]
