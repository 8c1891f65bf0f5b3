"""FastAPI dependencies: the transaction-owning session, settings, and request-body parsers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Depends, Request
from pydantic import ValidationError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from reward_models.scoring import Scorer
from service.api.errors import BadRequest
from service.api.validation import format_errors
from service.api.wire_checks import WireError, parse_json_body
from service.ingest.schemas import GroupIn, GroupsIn
from service.settings import Settings
from service.store.db import session_scope


def get_session(request: Request) -> Iterator[Session]:
    """One transaction per request: commit on success, roll back on any error."""
    yield from session_scope(request.app.state.sessionmaker)


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


def _validate(doc: Any) -> GroupsIn | GroupIn:
    """A body with a ``groups`` key is a batch, anything else one group (no union prefix in errors)."""
    if isinstance(doc, dict) and "groups" in doc:
        return GroupsIn.model_validate(doc, strict=True)
    return GroupIn.model_validate(doc, strict=True)


async def group_body(request: Request) -> GroupsIn | GroupIn:
    """Parse ``POST /v1/groups``: one group, or ``{"groups": [...]}``, from the document the request
    guard already parsed and checked (``service.api.middleware``)."""
    doc = request.scope.get("state", {}).get("json_body", _MISSING)
    if doc is _MISSING:
        body = await request.body()
        if not body:
            raise BadRequest("body: empty; expected a group or {\"groups\": [...]}", status_code=400)
        try:
            doc = parse_json_body(body)
        except WireError as exc:
            raise BadRequest(str(exc), status_code=exc.status) from None
    try:
        return await run_in_threadpool(_validate, doc)
    except ValidationError as exc:
        message, items = format_errors(exc.errors(include_url=False))
        raise BadRequest(message, detail=items) from None


_MISSING = object()
GroupBody = Annotated[GroupsIn | GroupIn, Depends(group_body)]
