"""GET /metrics (Prometheus), GET /v1/summary, GET /dashboard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from service.auth import PRODUCER, VIEWER, allow, public
from service.deps import SessionDep
from service.services import summary

router = APIRouter(tags=["observability"])
DASHBOARD = Path(__file__).resolve().parent.parent / "static" / "dashboard.html"


@router.get("/metrics", response_class=Response, dependencies=[allow(VIEWER, public_setting="metrics_public")])
def metrics(session: SessionDep) -> Response:
    return Response(summary.prometheus_text(session), media_type="text/plain; version=0.0.4")


@router.get("/v1/summary", dependencies=[allow(VIEWER, PRODUCER)])  # producers read the backlog
def get_summary(session: SessionDep) -> dict[str, Any]:
    return summary.summary(session)


@router.get("/dashboard", response_class=HTMLResponse, dependencies=[public()])  # the shell; its data needs a key
def dashboard() -> HTMLResponse:
    return HTMLResponse(DASHBOARD.read_text())
