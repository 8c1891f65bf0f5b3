"""The FastAPI application factory."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from service.alerts import router as alerts
from service.api import openapi
from service.api.errors import install_error_handlers
from service.api.middleware import RequestGuardMiddleware
from service.auth.service import RedactTokens, check_routes
from service.curation import router as curation
from service.delivery import arrow
from service.delivery import router as delivery
from service.delivery.ready import ReadyHub
from service.export import router as export
from service.export.service import ExportSlots
from service.ingest import router as ingest
from service.observability import health
from service.observability import router as observability
from service.observability.metrics import RequestMetricsMiddleware
from service.policy import router as policy
from service.sampling import router as sampling
from service.scoring import rescore_router
from service.scoring import router as scoring
from service.scoring.executor import DaemonThreadExecutor
from service.scoring.gate import ScoreGate
from service.scoring.path_key import PathKeyMiddleware
from service.sessions import router as sessions
from service.settings import Settings, get_settings
from service.specs import router as specs
from service.stats import router as stats
from service.store.db import get_engine, make_sessionmaker, resolve_database_url
from service.store.dbadmin import libpq_url

log = logging.getLogger(__name__)


# every domain's router, in the order their routes are matched and documented
ROUTERS = (
    delivery.router,
    export.router,
    health.router,
    ingest.router,
    scoring.router,
    observability.router,
    policy.router,
    rescore_router.router,
    sampling.router,
    sessions.router,
    specs.router,
    stats.router,
    alerts.router,
    curation.router,
)


def _settle() -> None:
    """A served process, before it serves: pyarrow's first array built (``arrow.warm_up``: it imports pandas
    where that is installed, ~1 s of CPU, which was the first Arrow lease of each API process), then everything
    the process holds so far frozen out of the garbage collector's reach. The app, its imports and the pools are
    ~200,000 objects that live as long as the process, and a full collection walking them paused every request
    in flight ~100 ms; frozen, it walks what requests made (bench/scale.py's trainer processes showed the same
    pause in their own leases: bench/lease.py). A warm-up that fails is logged, and the freeze happens anyway:
    the first Arrow lease then says what is wrong."""
    try:
        arrow.warm_up()
    except Exception:  # noqa: BLE001 - serve without it; the lease that needs pyarrow reports the error
        log.warning("Arrow warm-up failed (leases in Arrow may fail the same way)", exc_info=True)
    gc.freeze()


def _lifespan(start_worker: bool, url: str, served: bool):
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if served:  # before the first request: none waits on the import or shares the CPU with it
            await run_in_threadpool(_settle)
        worker = None
        if start_worker:
            from service.worker.main import WorkerThread

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
    settings: Settings | None = None, database_url: str | None = None, start_worker: bool = False,
    served: bool = False,
) -> FastAPI:
    """Build the app. The database must already be at the head migration (``serve`` and tests do that).
    ``start_worker`` runs the score / curate worker in a thread of this process; ``served``: the process is a
    server's own (``grpo-curator serve``), which settles once started (``_settle``); an app built inside another
    program (a test's client) leaves that program's garbage collector as it is."""
    settings = settings or get_settings()
    url = database_url or resolve_database_url(settings)
    app = FastAPI(
        lifespan=_lifespan(start_worker, url, served),
        title="grpo-curator",
        version="0.1.0",
        summary="Trajectory curation and reward service for GRPO-style RL",
        docs_url=None,  # /docs is served from service/observability/static (no assets from a CDN)
        redoc_url=None,
        openapi_url=None,  # /openapi.json is a declared route (viewer key once auth is on), see service/observability/router.py
    )
    openapi.install(app)
    app.state.settings = settings
    app.state.engine = get_engine(url)
    app.state.sessionmaker = make_sessionmaker(app.state.engine)
    app.state.scorer, app.state.scorer_lock, app.state.worker = None, threading.Lock(), None
    # the threads /v1/score's requests are scored on (awaited: no request holds a threadpool thread meanwhile)
    app.state.score_executor = DaemonThreadExecutor(settings.score_concurrency, thread_name_prefix="score")
    app.state.score_gate = ScoreGate(settings.score_pool_slots or 2 * settings.worker_processes,
                                     settings.score_max_in_flight_per_key, settings.score_retry_after_s)
    app.state.export_slots = ExportSlots(settings.export_max_concurrent, settings.export_retry_after_s)
    app.state.ready_url = libpq_url(url)  # /healthz connects on its own (service.observability.probes.check_database)
    app.state.ready_hub = ReadyHub(
        app.state.ready_url,
        max_waiters=settings.lease_max_waiters,
        check_s=settings.lease_wait_check_s,
        attempt_slots=settings.lease_attempt_slots or max(1, settings.db_pool_size // 2),
    )
    install_error_handlers(app)
    app.add_middleware(RequestGuardMiddleware, max_bytes=settings.max_body_bytes,
                       max_containers=settings.max_body_containers)
    app.add_middleware(RequestMetricsMiddleware)  # times every request, 413s included
    app.add_middleware(PathKeyMiddleware)  # outermost: an OpenRLHF key in the path becomes a header first
    for router in ROUTERS:
        app.include_router(router)
    check_routes(app)  # every route declares who may use it
    access_log = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactTokens) for f in access_log.filters):
        access_log.addFilter(RedactTokens())  # a token in a path (token_param routes) is never logged
    return app



def create_served_app() -> FastAPI:
    """The factory ``grpo-curator serve`` runs: settings from the environment, worker per settings."""
    settings = get_settings()
    return create_app(settings, start_worker=settings.embedded_worker, served=True)
