"""The FastAPI application factory."""

from __future__ import annotations

import contextlib
import importlib
import logging
import pkgutil
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI

import service.routers
from service import openapi
from service.auth import RedactTokens, check_routes
from service.db import get_engine, make_sessionmaker, resolve_database_url
from service.dbadmin import libpq_url
from service.errors import install_error_handlers
from service.integrations_middleware import PathKeyMiddleware
from service.metrics import RequestMetricsMiddleware
from service.middleware import RequestGuardMiddleware
from service.ready import ReadyHub
from service.settings import Settings, get_settings

log = logging.getLogger(__name__)


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
        app.state.worker = worker  # /v1/score shares its Scorer (pool, judge cache) when there is one
        yield
        app.state.score_executor.shutdown(wait=False, cancel_futures=True)
        app.state.ready_hub.close()
        if worker is not None:
            worker.close()
        if app.state.scorer is not None:  # the /v1/score pool
            app.state.scorer.close()

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
        openapi_url=None,  # /openapi.json is a declared route (viewer key once auth is on), see routers/observability
    )
    openapi.install(app)
    app.state.settings = settings
    app.state.engine = get_engine(url)
    app.state.sessionmaker = make_sessionmaker(app.state.engine)
    app.state.scorer, app.state.scorer_lock, app.state.worker = None, threading.Lock(), None
    # the threads /v1/score's requests are scored on (awaited: no request holds a threadpool thread meanwhile)
    app.state.score_executor = ThreadPoolExecutor(settings.score_concurrency, thread_name_prefix="score")
    app.state.ready_url = libpq_url(url)  # /healthz connects on its own (service.ready.check_database)
    app.state.ready_hub = ReadyHub(
        app.state.ready_url,
        max_waiters=settings.lease_max_waiters,
        check_s=settings.lease_wait_check_s,
        attempt_slots=settings.lease_attempt_slots or max(1, settings.db_pool_size // 2),
    )
    install_error_handlers(app)
    app.add_middleware(RequestGuardMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetricsMiddleware)  # times every request, 413s included
    app.add_middleware(PathKeyMiddleware)  # outermost: an OpenRLHF key in the path becomes a header first
    for router in _routers():
        app.include_router(router)
    check_routes(app)  # every route declares who may use it
    access_log = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactTokens) for f in access_log.filters):
        access_log.addFilter(RedactTokens())  # a token in a path (token_param routes) is never logged
    return app



def create_served_app() -> FastAPI:
    """The factory ``grpo-curator serve`` runs: settings from the environment, worker per settings."""
    settings = get_settings()
    return create_app(settings, start_worker=settings.embedded_worker)
