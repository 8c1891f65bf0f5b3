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


class PauseDetail(BaseModel):
    """The ``detail`` of a paused lease (503): the critical alert that pauses it and when to ask again."""

    alert: AlertOut
    retry_after_s: float


class LeasePausedOut(BaseModel):
    """``POST /v1/batches/lease`` 503: ``error`` says why; while a pause_leases alert is critical the
    ``detail`` names it (``PauseDetail``), when the database is unavailable ``detail`` is null."""

    error: str
    detail: PauseDetail | None = None


class AlertsOut(BaseModel):
    alerts: list[AlertOut]


PauseScope = Literal["all", "per_dataset"]


class MonitorIn(Strict):
    """``PUT /v1/monitors/{monitor}``: thresholds and action, overall (dataset null) or for one dataset.
    Every field is optional: one left out keeps the stored value (or, with none stored, inherits: a
    dataset's from the overall setting, the overall one from the monitor's defaults). Every monitor's
    value is >= 0 and higher is worse, so thresholds are > 0 (a warning of 0 could never resolve)."""

    dataset: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH, pattern=ID_PATTERN)
    warning: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    critical: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    action: MonitorAction | None = None
    scope: PauseScope | None = None  # overall only: per_dataset = a dataset's own alert pauses that dataset

    @model_validator(mode="after")
    def _given(self) -> MonitorIn:
        if self.warning is None and self.critical is None and self.action is None and self.scope is None:
            raise ValueError("warning: give at least one of warning, critical, action, scope")
        if self.scope is not None and self.dataset is not None:
            raise ValueError("scope: only an overall setting (dataset null) has a pause scope")
        return self


class MonitorOut(BaseModel):
    monitor: str
    dataset: str | None
    warning: float
    critical: float
    action: MonitorAction
    scope: PauseScope = "all"  # what an overall pause_leases pauses (docs/alerts.md, "The circuit breaker")
    default_warning: float
    default_critical: float
    source: str  # where the default thresholds come from


class MonitorsOut(BaseModel):
    monitors: list[MonitorOut]


class EvaluateOut(BaseModel):
    version: int  # the policy version the monitors were evaluated at
    transitions: list[dict[str, Any]]
