"""Liveness (``/healthz``) and readiness (``/readyz``).

``/healthz`` answers from the event loop alone: no database, no threadpool, so it never queues behind
request work. Its ``schema`` is the revision the process read when it started (``serve`` migrates before it
listens, so a process that answers was started against a reachable, migrated database; a process that
could not read it then asks on its own connection until it has seen one, 503 meanwhile). ``/readyz`` asks
the database now, on a connection of its own with a short timeout (``readyz_timeout_s``): 200 with the
live revision, else 503.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.auth import public
from service.ready import check_database

router = APIRouter(tags=["health"])


def _unavailable(problem: str) -> JSONResponse:
    return JSONResponse({"error": f"database: {problem}", "detail": None}, status_code=503,
                        headers={"Retry-After": "1"})


@router.get("/healthz", dependencies=[public()],
            responses={503: {"description": "the process has not yet seen a reachable, migrated database"}})
async def healthz(request: Request) -> JSONResponse:
    state = request.app.state
    if state.schema_revision is None:  # not read at start-up: ask (own connection) until it has been seen once
        revision, problem = await check_database(state.ready_url, state.settings.readyz_timeout_s)
        if problem is not None or revision is None:
            return _unavailable(problem or "not migrated (run grpo-curator migrate)")
        state.schema_revision = revision
    return JSONResponse({"status": "ok", "schema": state.schema_revision})


@router.get("/readyz", dependencies=[public()],
            responses={503: {"description": "the database did not answer within readyz_timeout_s"}})
async def readyz(request: Request) -> JSONResponse:
    state = request.app.state
    revision, problem = await check_database(state.ready_url, state.settings.readyz_timeout_s)
    if problem is not None:
        return _unavailable(problem)
    return JSONResponse({"status": "ok", "schema": revision or "none"})
