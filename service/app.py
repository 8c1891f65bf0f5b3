"""The FastAPI application factory."""

from __future__ import annotations

import contextlib
import importlib
import logging
import pkgutil
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

import service.routers
from service import openapi
from service.db import get_engine, make_sessionmaker, resolve_database_url
from service.deps import format_errors
from service.errors import ServiceError
from service.metrics import RequestMetricsMiddleware
from service.middleware import BodyLimitMiddleware
from service.settings import Settings, get_settings

log = logging.getLogger(__name__)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"error": exc.message, "detail": exc.detail}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse({"error": "body: invalid JSON", "detail": None}, status_code=400)
        message, items = format_errors(errors)
        return JSONResponse({"error": message, "detail": items}, status_code=422)


def _routers() -> list:
    """Every ``router`` defined in a module of ``service/routers`` (one module per domain)."""
    found = []
    for info in sorted(pkgutil.iter_modules(service.routers.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"service.routers.{info.name}")
        if hasattr(module, "router"):
            found.append(module.router)
    return found


def _lifespan(start_worker: bool, url: str):
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker = None
        if start_worker:
            from service.workers.main import WorkerThread

            worker = WorkerThread(app.state.settings, url)
            worker.start()
        yield
        if worker is not None:
            worker.close()

    return lifespan


def create_app(
    settings: Settings | None = None, database_url: str | None = None, start_worker: bool = False
) -> FastAPI:
    """Build the app. The database must already be at the head migration (``serve`` and tests do that).
    ``start_worker`` runs the score / curate worker in a thread of this process."""
    settings = settings or get_settings()
    url = database_url or resolve_database_url(settings)
    app = FastAPI(
        lifespan=_lifespan(start_worker, url),
        title="grpo-curator",
        version="0.1.0",
        summary="Trajectory curation and reward service for GRPO-style RL",
        docs_url=None,  # /docs is served from service/static (no assets from a CDN), see routers/observability
        redoc_url=None,
    )
    openapi.install(app)
    app.state.settings = settings
    app.state.engine = get_engine(url)
    app.state.sessionmaker = make_sessionmaker(app.state.engine)
    _install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetricsMiddleware)  # outermost: times every request, 413s included
    for router in _routers():
        app.include_router(router)
    return app


def create_served_app() -> FastAPI:
    """The factory ``grpo-curator serve`` runs: settings from the environment, worker per settings."""
    settings = get_settings()
    return create_app(settings, start_worker=settings.embedded_worker)
