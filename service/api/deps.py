"""FastAPI dependencies: the transaction-owning session, the settings and the scorer. (A body a domain
parses itself is that domain's dependency, e.g. ``service.ingest.body``.)"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Annotated

import anyio
from fastapi import Depends, Request
from sqlalchemy.orm import Session

from reward_models.scoring import Scorer
from service.settings import Settings


async def get_session(request: Request) -> AsyncIterator[Session]:
    """One transaction per request: commit on success, roll back on any error. The session takes a pooled
    connection when it is first used (in the route's worker thread), and its commit or rollback runs in a
    worker thread only when it holds a transaction: a request that never used it (a gateway call, its session
    key verified before) hands nothing to the threadpool for it."""
    with request.app.state.sessionmaker() as session:
        try:
            yield session
            if session.in_transaction():
                await _ended_in_thread(session.commit)
        except BaseException:
            if session.in_transaction():
                await _ended_in_thread(session.rollback)
            raise


async def _ended_in_thread(end: Callable[[], None]) -> None:
    # a limiter of its own, as FastAPI ends a sync dependency: ending a transaction never waits for a threadpool
    # thread that may itself be waiting for this session's pooled connection
    await anyio.to_thread.run_sync(end, limiter=anyio.CapacityLimiter(1))


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


# scope="function": the transaction commits before the response is sent, so a 2xx means durable
def get_scorer(request: Request) -> Scorer:
    """The in-process worker's Scorer when ``serve`` runs one (one pool, one judge cache for both), else
    the app's own, built on first use."""
    state = request.app.state
    worker = getattr(state, "worker", None)
    if worker is not None and worker.scorer is not None:
        return worker.scorer
    with state.scorer_lock:
        if state.scorer is None:
            s: Settings = state.settings
            state.scorer = Scorer(processes=s.worker_processes, timeout_s=s.component_timeout_s,
                                  memory_mb=s.component_memory_mb, judge_endpoints=s.judge_endpoints)
        return state.scorer


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
ScorerDep = Annotated[Scorer, Depends(get_scorer)]
