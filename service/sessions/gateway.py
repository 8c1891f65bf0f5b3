"""One agent call through the gateway: check the session, forward (no transaction open meanwhile), store
the call, then answer. The call is committed before its answer goes back, so a SIGKILL of the API loses
no answered call and a session goes on after a restart (everything it needs is in its row).

Whose failure is it: the upstream failing after its retries ends the session as ``env_error`` (the
environment's: never a negative); a tool call the model got wrong (``misuse``) marks the session, which
then finishes as ``tool_misuse`` (the model's: a failed outcome). Limits: the call after
``session_max_calls`` ends it as ``max_turns``, prompt + completion reaching ``session_max_tokens`` as
``length``, a call after ``session_max_seconds`` as ``timeout``; each such call is answered 409.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import Request
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import BadRequest, Conflict
from service.auth.service import PRODUCER
from service.sessions import group as group_service
from service.sessions import repository as repo
from service.sessions import service
from service.sessions.misuse import tool_misuse
from service.sessions.upstream import Forwarded, Tokens, extract, for_agent, forward
from service.settings import Settings
from service.store import arrays

_CLIENT_LOCK = threading.Lock()


def client_for(state: Any) -> httpx.Client:
    """The app's one pooled HTTP client to the upstreams (keep-alive: no new connection per call)."""
    with _CLIENT_LOCK:
        if getattr(state, "gateway_client", None) is None:
            state.gateway_client = httpx.Client(limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
        return state.gateway_client


@dataclass
class Answer:
    status: int
    payload: Any
    headers: dict[str, str]


def check_body(kind: str, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("body: a JSON object")
    if body.get("stream"):
        raise BadRequest("stream: the gateway does not stream; send stream: false (docs/agents.md)", status_code=400)
    if body.get("n", 1) != 1:
        raise BadRequest("n: one completion per call (a session is one trajectory)", status_code=400)
    if kind == "chat" and not isinstance(body.get("messages"), list):
        raise BadRequest("messages: a list of messages")
    if kind == "completions" and "prompt" not in body:
        raise BadRequest("prompt: required (text or token ids)")
    return body


def _limit(db: Session, row: Any, settings: Settings) -> str | None:
    if row.n_calls >= settings.session_max_calls:
        return "max_turns"
    if row.n_tokens >= settings.session_max_tokens:
        return "length"
    if (repo.now(db) - row.created_at).total_seconds() > settings.session_max_seconds:
        return "timeout"
    return None


def call(request: Request, factory: sessionmaker[Session], client: httpx.Client, settings: Settings,
         session_id: str, kind: str, body: Any) -> Answer:
    with factory.begin() as db:
        row = service.authorize(request, db, session_id, PRODUCER)
        check_body(kind, body)
        if row.status != "open":
            raise Conflict(f"session_id: the session has ended ({row.finish_reason})",
                           detail={"finish_reason": row.finish_reason})
        upstream, policy_version = row.upstream, row.policy_version
    with factory.begin() as db:  # a limit ends the session (committed even though the call is refused)
        row = repo.get_session(db, session_id, lock=True)
        reason = _limit(db, row, settings) if row is not None and row.status == "open" else None
        if reason is not None:
            repo.lock_group(db, row.group_id)
            service.close(db, row, reason)
            group_service.ingest_if_complete(db, row.group_id, settings)
    if reason is not None:
        raise Conflict(f"session_id: the session has ended ({reason}: a session limit)",
                       detail={"finish_reason": reason})
    result = forward(client, upstream, kind, body, settings.session_call_timeout_s, settings.session_retry_base_s)
    return _store(factory, settings, session_id, kind, body, upstream, policy_version, result)


def _store(factory: sessionmaker[Session], settings: Settings, session_id: str, kind: str, body: dict[str, Any],
           upstream: str, policy_version: int, result: Forwarded) -> Answer:
    tokens: Tokens | None = None
    error, misuse = result.error, None
    if error is None and 200 <= result.status < 300:
        try:
            tokens = extract(kind, result.payload)
        except ValueError as exc:
            error = f"upstream answer unusable: {exc}"
    elif error is None:
        error = f"upstream refused the request ({result.status})"  # the agent's request: passed back as is
    if tokens is not None and kind == "chat":
        misuse = tool_misuse(body.get("tools"), tokens.message.get("tool_calls"))
    with factory.begin() as db:
        row = repo.get_session(db, session_id, lock=True)
        assert row is not None
        repo.insert_call(db, {
            "session_id": session_id, "idx": row.n_calls, "kind": kind, "request": body,
            "response": None if tokens is None else {"message": tokens.message, "finish_reason": tokens.finish_reason},
            "prompt_ids": arrays.encode(tokens.prompt_ids, arrays.TOKEN_DTYPE) if tokens else None,
            "completion_ids": arrays.encode(tokens.completion_ids, arrays.TOKEN_DTYPE) if tokens else None,
            "logprobs": arrays.encode(tokens.logprobs, arrays.LOGPROB_DTYPE) if tokens else None,
            "finish_reason": tokens.finish_reason if tokens else None,
            "policy_version": result.policy_version if result.policy_version is not None else policy_version,
            "upstream": upstream, "attempts": result.attempts, "latency_ms": result.latency_ms,
            "error": error, "misuse": misuse,
        })
        row.n_calls += 1
        if tokens is not None:
            row.n_tokens = len(tokens.prompt_ids) + len(tokens.completion_ids)
        if misuse is not None and row.misuse is None:
            row.misuse = misuse
        broken = result.error is not None or (tokens is None and 200 <= result.status < 300)
        if row.status == "open" and (broken or row.n_tokens >= settings.session_max_tokens):
            repo.lock_group(db, row.group_id)
            service.close(db, row, "env_error" if broken else "length", error if broken else None)
            group_service.ingest_if_complete(db, row.group_id, settings)
    if broken:
        return Answer(502, {"error": {"message": error, "type": "upstream_error"}}, {})
    headers = {"x-grpo-curator-call": str(row.n_calls - 1)}
    return Answer(result.status, for_agent(kind, body, result.payload), headers)
