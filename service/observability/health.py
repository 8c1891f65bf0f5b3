"""Liveness (``/healthz``) and readiness (``/readyz``).

``/healthz`` never queues behind request work: it is async, takes no pooled connection and no threadpool
thread. It keeps its contract (200 when the database is reachable and migrated, else 503 with
``Retry-After``) by asking the database on a connection of its own, with a short timeout
(``readyz_timeout_s``); concurrent calls share one check in flight (``service.observability.probes.SingleFlight``), so the
public route costs at most one connection per process. A result younger than ``healthz_fresh_s`` (1 s) is
answered from memory, and an older one too while the next check runs in the background, up to
``healthz_fresh_s + readyz_timeout_s + 1`` s old (``RecentCheck``): a /healthz request never awaits the
database while probes keep coming, so it costs one turn of the event loop, not the several a check takes
(the loop it shares with the long polls and ingest is what its p99 waited on).

``/readyz`` answers whether this process can serve database work now: a connection from the request pool
and the schema revision within ``readyz_timeout_s``, else 503 (a saturated pool or threadpool makes the
process not ready, so a load balancer sends traffic elsewhere while it stays alive).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from service.auth.service import public
from service.observability.probes import RecentCheck, SingleFlight, check_database

router = APIRouter(tags=["health"])


def _unavailable(problem: str) -> JSONResponse:
    return JSONResponse({"error": f"database: unavailable; retry later ({problem})", "detail": None},
                        status_code=503, headers={"Retry-After": "1"})


def _answer(revision: str | None, problem: str | None) -> JSONResponse:
    if problem is not None:
        return _unavailable(problem)
    if revision is None:
        return _unavailable("not migrated (run grpo-curator migrate)")
    return JSONResponse({"status": "ok", "schema": revision})


def _probe(request: Request, name: str, check) -> SingleFlight:  # noqa: ANN001 - an async callable
    state = request.app.state
    if not hasattr(state, name):
        setattr(state, name, SingleFlight(check))
    return getattr(state, name)


def _recent_probe(request: Request, name: str, check) -> RecentCheck:  # noqa: ANN001 - an async callable
    state = request.app.state
    if not hasattr(state, name):
        s = state.settings
        fresh = s.healthz_fresh_s
        setattr(state, name, RecentCheck(check, fresh, fresh + s.readyz_timeout_s + 1.0))
    return getattr(state, name)


@router.get("/healthz", dependencies=[public()],
            responses={503: {"description": "the database is unreachable or not migrated"}})
async def healthz(request: Request) -> JSONResponse:
    state = request.app.state

    async def own_connection() -> tuple[str | None, str | None]:
        return await check_database(state.ready_url, state.settings.readyz_timeout_s)

    return _answer(*await _recent_probe(request, "health_probe", own_connection)())


def _pooled_revision(engine) -> str | None:  # noqa: ANN001 - an Engine
    with engine.connect() as conn:
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one_or_none()


@router.get("/readyz", dependencies=[public()],
            responses={503: {"description": "no pooled connection or no answer within readyz_timeout_s"}})
async def readyz(request: Request) -> JSONResponse:
    state = request.app.state

    async def pooled() -> tuple[str | None, str | None]:
        timeout = state.settings.readyz_timeout_s
        try:
            return await asyncio.wait_for(run_in_threadpool(_pooled_revision, state.engine), timeout), None
        except TimeoutError:
            return None, f"no pooled connection answered within {timeout:g} s"
        except sa_exc.SQLAlchemyError as exc:
            return None, type(exc).__name__

    return _answer(*await _probe(request, "ready_probe", pooled)())
