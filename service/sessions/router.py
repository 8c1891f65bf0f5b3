"""Agent sessions: create, the OpenAI-compatible calls, finish, read (docs/agents.md)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from service.api.deps import SessionDep, SettingsDep
from service.api.errors import BadRequest
from service.auth.service import PRODUCER, SERVICE, TRAINER, VIEWER, KeyDep, allow
from service.sessions import gateway
from service.sessions import service as sessions
from service.sessions.schemas import FinishIn, FinishOut, SegmentOut, SessionCreated, SessionIn, SessionOut

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])
# the session's own routes admit its session key (service.auth.SessionKey, checked against the path's
# session_id before the route runs) or an API key; service.sessions.authorize then checks the dataset
_SESSION_ROUTE = [allow(PRODUCER, dataset=SERVICE, session_param="session_id")]
_SESSION_READ = [allow(PRODUCER, TRAINER, VIEWER, dataset=SERVICE, session_param="session_id")]


@router.post("", response_model=SessionCreated, status_code=201, dependencies=[allow(PRODUCER, dataset=SERVICE)])
def create_session(body: SessionIn, request: Request, session: SessionDep, settings: SettingsDep,
                   key: KeyDep) -> SessionCreated:
    return sessions.create_session(session, body, key, settings, str(request.base_url))


async def _body(request: Request) -> Any:
    """The request's JSON: as the request guard parsed and checked it (``service.api.middleware``), else parsed here."""
    parsed = request.scope.get("state", {}).get("json_body", _UNPARSED)
    if parsed is not _UNPARSED:
        return parsed
    try:
        return orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        raise BadRequest("body: not JSON") from None


_UNPARSED = object()


async def _call(request: Request, session_id: str, kind: str) -> JSONResponse:
    body = await _body(request)
    state = request.app.state
    answer = await run_in_threadpool(gateway.call, request, state.sessionmaker, gateway.client_for(state),
                                     state.settings, session_id, kind, body)
    return JSONResponse(answer.payload, status_code=answer.status, headers=answer.headers)


@router.post("/{session_id}/chat/completions", dependencies=_SESSION_ROUTE)
async def chat_completions(session_id: str, request: Request) -> JSONResponse:
    return await _call(request, session_id, "chat")


@router.post("/{session_id}/completions", dependencies=_SESSION_ROUTE)
async def completions(session_id: str, request: Request) -> JSONResponse:
    return await _call(request, session_id, "completions")


@router.post("/{session_id}/finish", response_model=FinishOut, dependencies=_SESSION_ROUTE)
def finish(session_id: str, body: FinishIn, request: Request, session: SessionDep, settings: SettingsDep) -> FinishOut:
    return sessions.finish(request, session, session_id, body, settings)


@router.post("/{session_id}/segment", response_model=SegmentOut, dependencies=_SESSION_ROUTE)
def segment(session_id: str, request: Request, session: SessionDep) -> SegmentOut:
    """Mark a summary checkpoint: the next call starts a new segment of the session's trajectory."""
    return sessions.segment(request, session, session_id)


@router.get("/{session_id}", response_model=SessionOut, dependencies=_SESSION_READ)
def get_session(session_id: str, request: Request, session: SessionDep, include_tokens: bool = False) -> SessionOut:
    return sessions.get(request, session, session_id, include_tokens)
