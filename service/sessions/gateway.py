"""One agent call through the gateway: check the session, reserve the call's slot (stored as in flight,
``attempts`` 0, under the session's row lock: concurrent calls never pass ``session_max_calls``), forward
(no transaction open meanwhile), store the call (refused, 409, when the session ended meanwhile), then
answer. The call is committed before its answer goes back, so a SIGKILL of the API loses
no answered call and a session goes on after a restart (everything it needs is in its row).

Whose failure is it: the upstream failing after its retries ends the session as ``env_error`` (the
environment's: never a negative); a tool call the model got wrong (``misuse``) marks the session, which
then finishes as ``tool_misuse`` (the model's: a failed outcome). Limits: the call after
``session_max_calls`` ends it as ``max_turns``, prompt + completion reaching ``session_max_tokens`` as
``length``, a call after ``session_max_seconds`` as ``timeout``; each such call is answered 409. An answer
the upstream gave up on (vLLM's and SGLang's ``finish_reason: "abort"``: preempted, cancelled, the engine
shutting down) is stored and passed on, and ends the session as ``aborted`` (the environment's: never a
negative, whatever the agent says at finish). A tool misuse the gateway saw wins over every later end
(``service.close``): the session then ends as ``tool_misuse``.
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
from service.sessions import sampling, service
from service.sessions.misuse import tool_misuse
from service.sessions.upstream import Forwarded, Tokens, extract, for_agent, forward, served_models
from service.settings import Settings
from service.store import arrays

ABORT_REASONS = frozenset({"abort"})  # an upstream's finish_reason for a request it gave up on
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


def check_body(kind: sampling.Kind, body: Any) -> dict[str, Any]:
    """The agent's request, or a 400 naming its first field the route does not accept or whose value is not
    allowed (the agent's error: never the session's environment failure; ``sampling.check``)."""
    if not isinstance(body, dict):
        raise BadRequest("body: a JSON object")
    sampling.check(kind, body)
    return body


def _check_model(state: Any, client: httpx.Client, upstream: str, body: dict[str, Any], timeout_s: float) -> None:
    """A 400 unless the agent's ``model`` is absent or a name the upstream serves its own model under. The
    names are read once per upstream and kept on the app (read again before a name is refused: the
    upstream may have been restarted under another)."""
    asked = body.get("model")
    if asked is None:
        return
    known: dict[str, frozenset[str]] = getattr(state, "served_models", None) or {}
    served = known.get(upstream)
    if served is None or asked not in served:
        served = served_models(client, upstream, timeout_s)
        if served is not None:
            state.served_models = {**known, upstream: served}
    sampling.check_model(asked, served)


def _limit(db: Session, row: Any, settings: Settings) -> str | None:
    if row.n_calls >= settings.session_max_calls and (
            row.n_calls - repo.segment_marks(db, row.id) >= settings.session_max_calls):  # marks are no calls
        return "max_turns"
    if row.n_tokens >= settings.session_max_tokens:
        return "length"
    if (repo.now(db) - row.created_at).total_seconds() > settings.session_max_seconds:
        return "timeout"
    started = repo.group_started_at(db, row.group_id)
    if started is not None and (repo.now(db) - started).total_seconds() > settings.session_group_deadline_s:
        return "timeout"  # the group's deadline: the environment's limit
    return None


def _check_temperature(db: Session, group_id: str, body: dict[str, Any]) -> None:
    """A group trains at one temperature: its first call's (1.0 when it gave none); a call at another is a 400."""
    made, first = repo.group_temperature(db, group_id)
    asked, fixed = sampling.temperature(body), sampling.temperature({"temperature": first})
    if made and fixed != asked:
        raise BadRequest(f"temperature: the group's calls are sampled at {fixed:g} (its "
                         f"first call's), got {asked:g}; a trajectory is trained at one temperature", status_code=400)


def capped(body: dict[str, Any], left: int) -> dict[str, Any]:
    """The request as forwarded: an asked ``max_tokens`` (``max_completion_tokens``) above what is left of the
    session's token budget is lowered to it (never raised; none asked stays none)."""
    out = body
    for field in ("max_tokens", "max_completion_tokens"):
        asked = body.get(field)
        if isinstance(asked, int) and asked > left:
            out = dict(out, **{field: max(left, 1)})
    return out


def _reserve(factory: sessionmaker[Session], settings: Settings, session_id: str, kind: sampling.Kind,
             body: dict[str, Any], upstream: str) -> tuple[int, dict[str, Any]]:
    """The call's index, reserved atomically (the session row locked): a stored placeholder (``attempts`` 0)
    counts against ``session_max_calls`` while the call is in flight, so concurrent calls never pass it. A
    limit reached ends the session (committed though the call is refused, 409)."""
    with factory.begin() as db:
        row = repo.get_session(db, session_id, lock=True)
        if row is None or row.status != "open":
            reason = row.finish_reason if row is not None else None
            raise Conflict(f"session_id: the session has ended ({reason})", detail={"finish_reason": reason})
        reason = _limit(db, row, settings)
        if reason == "max_turns" and repo.in_flight(db, session_id, settings.session_call_timeout_s + 5):
            raise Conflict("session_id: the session's calls (GRPO_CURATOR_SESSION_MAX_CALLS) are all taken by calls "
                           "in flight", detail={"finish_reason": None})
        if reason is None:  # (no group lock on this path: the lock order stays row -> group, as at finish)
            _check_temperature(db, row.group_id, body)
            idx, sent = row.n_calls, capped(sampling.sent(kind, body), settings.session_max_tokens - row.n_tokens)
            row.n_calls += 1
            repo.insert_call(db, {"session_id": session_id, "idx": idx, "kind": kind, "request": sent,
                                  "upstream": upstream, "attempts": 0, "latency_ms": 0.0})
            return idx, sent
        repo.lock_group(db, row.group_id)
        service.close(db, row, reason)
        group_service.ingest_if_complete(db, row.group_id, settings)
        reason = row.finish_reason
    raise Conflict(f"session_id: the session has ended ({reason}: a session limit)", detail={"finish_reason": reason})


def call(request: Request, factory: sessionmaker[Session], client: httpx.Client, settings: Settings,
         session_id: str, kind: sampling.Kind, body: Any) -> Answer:
    with factory.begin() as db:
        row = service.authorize(request, db, session_id, PRODUCER)
        check_body(kind, body)
        if row.status != "open":
            raise Conflict(f"session_id: the session has ended ({row.finish_reason})",
                           detail={"finish_reason": row.finish_reason})
        upstream, policy_version = row.upstream, row.policy_version
    _check_model(request.app.state, client, upstream, body, min(settings.session_call_timeout_s, 10.0))
    idx, sent = _reserve(factory, settings, session_id, kind, body, upstream)
    try:
        result = forward(client, upstream, kind, sent, settings.session_call_timeout_s, settings.session_retry_base_s,
                         meta_info=settings.inference_sglang_meta_info)
    except BaseException as exc:  # never a reservation left in flight: recorded as a failed, unanswered call
        with factory.begin() as db:
            placeholder = repo.get_call(db, session_id, idx)
            if placeholder is not None:
                placeholder.attempts, placeholder.error = 1, f"gateway: {exc.__class__.__name__}: {str(exc)[:200]}"
        raise
    return _store(factory, settings, session_id, idx, kind, body, upstream, policy_version, result)


def _store(factory: sessionmaker[Session], settings: Settings, session_id: str, idx: int, kind: str,
           body: dict[str, Any], upstream: str, policy_version: int, result: Forwarded) -> Answer:
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
        placeholder = repo.get_call(db, session_id, idx)
        assert placeholder is not None
        placeholder.attempts, placeholder.latency_ms = max(result.attempts, 1), result.latency_ms
        if row.status != "open":  # the session ended while the call was in flight: nothing of it kept
            placeholder.error = (f"not answered: the session ended ({row.finish_reason}) while this call was in "
                                 "flight; its answer was discarded")
            ended_as = row.finish_reason
        else:
            ended_as = None
            placeholder.response = (None if tokens is None
                                    else {"message": tokens.message, "finish_reason": tokens.finish_reason})
            if tokens is not None:
                placeholder.prompt_ids = arrays.encode(tokens.prompt_ids, arrays.TOKEN_DTYPE)
                placeholder.completion_ids = arrays.encode(tokens.completion_ids, arrays.TOKEN_DTYPE)
                placeholder.logprobs = arrays.encode(tokens.logprobs, arrays.LOGPROB_DTYPE)
                placeholder.finish_reason = tokens.finish_reason
            placeholder.policy_version = (result.policy_version if result.policy_version is not None
                                          else policy_version)
            placeholder.error, placeholder.misuse = error, misuse
            if tokens is not None:
                row.n_tokens = len(tokens.prompt_ids) + len(tokens.completion_ids)
            if misuse is not None and row.misuse is None:
                row.misuse = misuse
            broken = result.error is not None or (tokens is None and 200 <= result.status < 300)
            aborted = tokens is not None and tokens.finish_reason in ABORT_REASONS
            ended = ("env_error" if broken else "aborted" if aborted
                     else "length" if row.n_tokens >= settings.session_max_tokens else None)
            if ended is not None:
                repo.lock_group(db, row.group_id)
                why = error if broken else f"the upstream aborted call {idx}" if aborted else None
                service.close(db, row, ended, why)
                group_service.ingest_if_complete(db, row.group_id, settings)
    if ended_as is not None:
        raise Conflict(f"session_id: the session ended ({ended_as}) while this call was in flight; its answer "
                       "was not kept", detail={"finish_reason": ended_as})
    if broken:
        return Answer(502, {"error": {"message": error, "type": "upstream_error"}}, {})
    headers = {"x-grpo-curator-call": str(idx)}
    return Answer(result.status, for_agent(kind, body, result.payload), headers)
