"""API schemas of policy versions (DESIGN.md "API v1": /v1/policy)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from filters.monitors import metric_problem
from service.api.schemas import INT4_MAX, FreeJson


class PolicyIn(FreeJson):
    """``POST /v1/policy``: the trainer's new version and its step metrics."""

    version: int = Field(ge=0, le=INT4_MAX)
    metrics: dict[str, Any] = Field(default_factory=dict)

    @field_validator("metrics")
    @classmethod
    def _domains(cls, metrics: dict[str, Any]) -> dict[str, Any]:
        """The metrics the monitors read must lie in their domain (filters.monitors.METRIC_DOMAINS)."""
        for key, value in metrics.items():
            problem = metric_problem(key, value)
            if problem is not None:
                raise ValueError(f"metrics.{key}: {problem}")
        return metrics


class PolicyOut(BaseModel):
    version: int
    metrics: dict[str, Any]
    created_at: str | None


class PolicyHistory(BaseModel):
    versions: list[PolicyOut]
