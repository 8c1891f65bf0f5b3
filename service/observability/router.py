"""GET /metrics (Prometheus), GET /v1/summary, GET /dashboard, GET /docs, GET /openapi.json."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from service.api.deps import SessionDep
from service.api.errors import NotFound
from service.auth.service import ANY, PRODUCER, TRAINER, VIEWER, allow, public
from service.observability import metrics as process_metrics
from service.observability import summary

router = APIRouter(tags=["observability"])
STATIC = Path(__file__).resolve().parent / "static"
DASHBOARD = STATIC / "dashboard.html"
DOCS = STATIC / "docs.html"


@router.get("/metrics", response_class=Response, dependencies=[allow(VIEWER, public_setting="metrics_public")])
def metrics(session: SessionDep) -> Response:
    """The database gauges (the same from every replica) and this process's request / scoring metrics."""
    body = summary.prometheus_text(session) + process_metrics.process_text()
    return Response(body, media_type="text/plain; version=0.0.4")


@router.get("/v1/summary", dependencies=[allow(VIEWER, PRODUCER, dataset="dataset")])  # producers: backlog
def get_summary(session: SessionDep, dataset: Annotated[str | None, Query(min_length=1)] = None) -> dict[str, Any]:
    """The service's counts; ``dataset``: that dataset's only (required for a key scoped to datasets)."""
    return summary.summary(session, dataset)


@router.get("/dashboard", response_class=HTMLResponse, dependencies=[public()])  # the shell; its data needs a key
def dashboard() -> HTMLResponse:
    return HTMLResponse(DASHBOARD.read_text())


@router.get("/docs", response_class=HTMLResponse, include_in_schema=False, dependencies=[public()])
def docs() -> HTMLResponse:
    """The API reference, rendered in the browser from /openapi.json with nothing loaded from elsewhere."""
    return HTMLResponse(DOCS.read_text())


@router.get("/openapi.json", include_in_schema=False, dependencies=[allow(VIEWER, PRODUCER, TRAINER, dataset=ANY)])
def openapi_document(request: Request) -> JSONResponse:
    """The OpenAPI document: any key once auth is on (/docs, a public shell, fetches it with the stored key)."""
    return JSONResponse(request.app.openapi())


ASSETS = {"dashboard.js": "text/javascript", "charts.js": "text/javascript", "dashboard.css": "text/css",
          "alerts.js": "text/javascript"}


@router.get("/dashboard/static/{name}", include_in_schema=False, dependencies=[public()])
def dashboard_asset(name: str) -> Response:
    """The dashboard's scripts and styles, shipped in the package (a fixed list: no path from the URL)."""
    if name not in ASSETS:
        raise NotFound(f"no dashboard asset {name!r}")
    return Response((STATIC / name).read_bytes(), media_type=ASSETS[name], headers={"Cache-Control": "no-cache"})
