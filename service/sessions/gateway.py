"""One agent call through the gateway: check the caller, the request and the session, and reserve the call's slot
(stored as in flight, ``attempts`` 0, under the session's row lock: concurrent calls never pass
``session_max_calls``), all in one transaction; forward (no transaction open meanwhile); store the call
(refused, 409, when the session ended meanwhile), then answer. The call is committed before its answer goes
back, so a SIGKILL of the API loses no answered call and a session goes on after a restart (everything it
needs is in its row).

Cost per call (``bench/gateway.py``): two connections from the pool, two statements, one hand-off to the
threadpool. The reservation writes the placeholder and the session's count in one statement
(``repository.reserve_call``) that finds the session as the checks saw it: as the session's last call through
this process left it (``_known``), else as read first with what the limits need (``repository.call_slot``: a
third statement); an answer that ends nothing is stored by one statement that is its own transaction
(``repository.store_answer``: the session's row, while open, then the call's), any other on the locked path
(``_store_locked``). The route's access check verified the session key (a positive check is cached:
``service.auth``); it is checked again here against the session's row.

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
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from fastapi import Request
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import BadRequest, Conflict, NotFound, ServiceError
from service.api.lru import Lru
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
            # idle connections dropped after 4 s: before an upstream on uvicorn (vLLM, SGLang, `infer`: 5 s)
            # closes them, so a call is not sent into a closing connection (a retry and a second generation)
            state.gateway_client = httpx.Client(limits=httpx.Limits(max_connections=256, max_keepalive_connections=64,
                                                                    keepalive_expiry=4.0))
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


class _NamesUnread(Exception):
    """The agent names a model and the upstream's served names are not known to include it: they are read
    (``_served``) outside any transaction, then the call is checked again."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.upstream = upstream


def _check_model(state: Any, upstream: str, body: dict[str, Any], fetched: dict[str, frozenset[str] | None]) -> None:
    """A 400 unless the agent's ``model`` is absent or a name the upstream serves its own model under. The
    names are read once per upstream and kept on the app (read again before a name is refused: the
    upstream may have been restarted under another); ``fetched``: the names this call read."""
    asked = body.get("model")
    if asked is None:
        return
    if upstream in fetched:
        served = fetched[upstream]
    else:
        served = (getattr(state, "served_models", None) or {}).get(upstream)
        if served is None or asked not in served:
            raise _NamesUnread(upstream)
    sampling.check_model(asked, served)


def _served(state: Any, client: httpx.Client, upstream: str, timeout_s: float) -> frozenset[str] | None:
    served = served_models(client, upstream, timeout_s)
    if served is not None:
        state.served_models = {**(getattr(state, "served_models", None) or {}), upstream: served}
    return served


def _limit(db: Session, slot: repo.CallSlot, settings: Settings) -> str | None:
    """The session limit the call reaches, if any; the clock's (``timeout``) only on a slot read with it (else the
    reservation checks the database's clock against ``_deadline``)."""
    row = slot.row
    if row.n_calls >= settings.session_max_calls and (
            row.n_calls - repo.segment_marks(db, row.id) >= settings.session_max_calls):  # marks are no calls
        return "max_turns"
    if row.n_tokens >= settings.session_max_tokens:
        return "length"
    if slot.now is not None and slot.now > _deadline(slot, settings):
        return "timeout"
    return None


_NEVER = datetime.max.replace(tzinfo=UTC)


def _deadline(slot: repo.CallSlot, settings: Settings) -> datetime:
    """The last moment the session takes a call: ``session_max_seconds`` after it began, or its group's deadline
    (the environment's limit) when that comes first."""
    ends = _after(slot.row.created_at, settings.session_max_seconds)
    if slot.group_started is not None:
        ends = min(ends, _after(slot.group_started, settings.session_group_deadline_s))
    return ends


def _after(start: datetime, seconds: float) -> datetime:
    try:
        return start + timedelta(seconds=seconds)
    except OverflowError:  # a limit past the calendar: none
        return _NEVER


def _check_temperature(slot: repo.CallSlot, body: dict[str, Any]) -> None:
    """A group trains at one temperature: its first call's (1.0 when it gave none); a call at another is a 400."""
    asked, fixed = sampling.temperature(body), sampling.temperature({"temperature": slot.first_temperature})
    if slot.made and fixed != asked:
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


@dataclass(frozen=True)
class _Reserved:
    idx: int
    sent: dict[str, Any]  # the request as forwarded (and stored)
    upstream: str
    policy_version: int


def _slot(request: Request, db: Session, session_id: str, lock: bool) -> repo.CallSlot:
    """The session's row (``lock``: locked) and what the call's checks read, when the caller may use it
    (``service.admit``)."""
    slot = repo.call_slot(db, session_id, lock)
    if not service.admit(request, db, slot.row if slot is not None else None, session_id, PRODUCER):
        slot = repo.call_slot(db, session_id, lock)  # an API key's lookup ended the transaction: read again
        if slot is None:
            raise NotFound(f"session_id: no session {session_id!r}")
    return slot


def _check(request: Request, db: Session, slot: repo.CallSlot, kind: sampling.Kind, body: Any,
           settings: Settings, fetched: dict[str, frozenset[str] | None]) -> str | None:
    """The request (400), the session's state (409) and model (400); the session limit the call reaches, if any."""
    row = slot.row
    check_body(kind, body)
    if row.status != "open":
        raise Conflict(f"session_id: the session has ended ({row.finish_reason})",
                       detail={"finish_reason": row.finish_reason})
    _check_model(request.app.state, row.upstream, body, fetched)
    return _limit(db, slot, settings)


def _placeholder(db: Session, slot: repo.CallSlot, settings: Settings, kind: sampling.Kind,
                 body: dict[str, Any]) -> _Reserved | None:
    """The call's placeholder stored at the session's next index, while the session is as the checks saw it and
    before its deadline (``repository.reserve_call``); None when it is not."""
    row = slot.row
    _check_temperature(slot, body)
    sent = capped(sampling.sent(kind, body), settings.session_max_tokens - row.n_tokens)
    if not repo.reserve_call(db, {"session_id": row.id, "idx": row.n_calls, "kind": kind, "request": sent,
                                  "upstream": row.upstream, "attempts": 0, "latency_ms": 0.0},
                             slot, _deadline(slot, settings)):
        return None
    return _Reserved(row.n_calls, sent, row.upstream, row.policy_version)


# Each session as the last call this process reserved or stored for it left it (a slot without a clock): the
# session's next call is checked against it and reserved by one statement, reading nothing first; the
# reservation finds the session so or writes nothing (another call, a segment mark, its end, a call through
# another API process, its or its group's start moved, its group's first call is another, the deadline passed),
# and the call then reads the session; a refusal by what was known (the group's temperature) is decided again
# on the session as read. Kept only once the group made a call (a group's first call is reserved under the
# group's lock, ``_locked_reservation``). At most 16,384 sessions (~11 MB), the least recently used dropped
# first (a process with more sessions in flight reads some of them again).
_known = Lru[str, repo.CallSlot](size=16384)


def _leave(slot: repo.CallSlot, n_calls: int, n_tokens: int) -> None:
    """``slot``'s session known (``_known``) with ``n_calls`` calls and ``n_tokens`` tokens."""
    _known.put(slot.row.id, replace(slot, row=slot.row._replace(n_calls=n_calls, n_tokens=n_tokens), now=None))


def _checked_placeholder(request: Request, db: Session, slot: repo.CallSlot, kind: sampling.Kind, body: Any,
                         settings: Settings, fetched: dict[str, frozenset[str] | None]) -> _Reserved | None:
    if _check(request, db, slot, kind, body, settings, fetched) is not None:
        return None
    if not slot.made:  # the group's first call fixes its temperature: reserved under the group's lock only
        return None
    reserved = _placeholder(db, slot, settings, kind, body)
    if reserved is not None and slot.made:
        _leave(slot, reserved.idx + 1, slot.row.n_tokens)
    return reserved


def _reserve(request: Request, factory: sessionmaker[Session], settings: Settings, session_id: str,
             kind: sampling.Kind, body: dict[str, Any], fetched: dict[str, frozenset[str] | None]) -> _Reserved:
    """The call checked (who calls, the request, the session's state and limits) and its index reserved: a
    stored placeholder (``attempts`` 0) counts against ``session_max_calls`` while the call is in flight.
    First without a lock, each statement its own transaction (autocommit): the placeholder is written only
    if the session is still as the checks saw it (open, at the index and tokens read, before its deadline), so
    concurrent calls never share an index nor pass ``session_max_calls``. A session key's call is checked
    against the session as this process last left it (``_known``), its reservation the one statement; else, or
    when that finds the session changed, the session is read first. A call at a limit, or one that lost a
    race, takes ``_reserve_locked``."""
    with factory() as db:
        db.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        known = _known.get(session_id) if service.holds_session_key(request) else None
        reserved = None
        if known is not None and service.admit(request, db, known.row, session_id, PRODUCER):
            try:
                reserved = _checked_placeholder(request, db, known, kind, body, settings, fetched)
            except BadRequest:  # refused by what this process knew (the group's temperature): the session decides
                reserved = None
        if reserved is None:
            _known.drop(session_id)
            reserved = _checked_placeholder(request, db, _slot(request, db, session_id, lock=False), kind, body,
                                            settings, fetched)
        db.commit()  # (an API key's check ends the first transaction: what follows it is an ordinary one)
    return reserved if reserved is not None else _reserve_locked(request, factory, settings, session_id, kind, body,
                                                                 fetched)


def _reserve_locked(request: Request, factory: sessionmaker[Session], settings: Settings, session_id: str,
                    kind: sampling.Kind, body: dict[str, Any], fetched: dict[str, frozenset[str] | None]) -> _Reserved:
    """``_reserve`` in one transaction with the session row locked. A limit reached ends the session
    (committed though the call is refused, 409). (Not ``factory.begin()``: an API key's check commits the
    transaction it began, and the session goes on in a new one.)"""
    _known.drop(session_id)
    with factory() as db:
        try:
            reserved, reason = _locked_reservation(request, db, settings, session_id, kind, body, fetched)
            db.commit()
        except BaseException:
            db.rollback()
            raise
    if reserved is not None:
        return reserved
    raise Conflict(f"session_id: the session has ended ({reason}: a session limit)", detail={"finish_reason": reason})


def _locked_reservation(request: Request, db: Session, settings: Settings, session_id: str, kind: sampling.Kind,
                        body: dict[str, Any], fetched: dict[str, frozenset[str] | None]
                        ) -> tuple[_Reserved | None, str | None]:
    """(the reservation, None), or (None, the finish reason of the session a limit ended)."""
    slot = _slot(request, db, session_id, lock=True)
    if not slot.made:
        # no call in the group yet: concurrent first calls of its sessions (through any process) would each
        # see none and each fix a temperature; under the group's lock (row -> group, as at finish) they come
        # one after the other, each reading what the one before stored
        repo.lock_group(db, slot.row.group_id)
        slot = repo.call_slot(db, session_id, lock=True) or slot
    row = slot.row
    reason = _check(request, db, slot, kind, body, settings, fetched)
    if reason == "max_turns" and repo.in_flight(db, session_id, settings.session_call_timeout_s + 5):
        raise Conflict("session_id: the session's calls (GRPO_CURATOR_SESSION_MAX_CALLS) are all taken by calls "
                       "in flight", detail={"finish_reason": None})
    if reason is None:  # (the group's lock only for its first call: the lock order stays row -> group, as at finish)
        reserved = _placeholder(db, slot, settings, kind, body)
        if reserved is None:  # the row is locked: only its group's start moved (a session created meanwhile)
            raise ServiceError("session_id: the session's group changed while this call was reserved; call "
                               "again", status_code=503)
        return reserved, None
    repo.lock_group(db, row.group_id)
    service.close(db, row, reason)
    group_service.ingest_if_complete(db, row.group_id, settings)
    return None, row.finish_reason


def call(request: Request, factory: sessionmaker[Session], client: httpx.Client, settings: Settings,
         session_id: str, kind: sampling.Kind, body: Any) -> Answer:
    fetched: dict[str, frozenset[str] | None] = {}
    while True:  # twice at most: a session's upstream never changes
        try:
            reserved = _reserve(request, factory, settings, session_id, kind, body, fetched)
            break
        except _NamesUnread as exc:
            timeout_s = min(settings.session_call_timeout_s, 10.0)
            fetched[exc.upstream] = _served(request.app.state, client, exc.upstream, timeout_s)
    try:
        result = forward(client, reserved.upstream, kind, reserved.sent, settings.session_call_timeout_s,
                         settings.session_retry_base_s, meta_info=settings.inference_sglang_meta_info)
    except BaseException as exc:  # never a reservation left in flight: recorded as a failed, unanswered call
        with factory.begin() as db:
            placeholder = repo.get_call(db, session_id, reserved.idx)
            if placeholder is not None:
                placeholder.attempts, placeholder.error = 1, f"gateway: {exc.__class__.__name__}: {str(exc)[:200]}"
        raise
    return _store(factory, settings, session_id, reserved.idx, kind, body, reserved.policy_version, result)


def _store(factory: sessionmaker[Session], settings: Settings, session_id: str, idx: int, kind: str,
           body: dict[str, Any], policy_version: int, result: Forwarded) -> Answer:
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
    values = _answered(result, tokens, error, misuse, policy_version)
    broken = result.error is not None or (tokens is None and 200 <= result.status < 300)
    aborted = tokens is not None and tokens.finish_reason in ABORT_REASONS
    n_tokens = None if tokens is None else len(tokens.prompt_ids) + len(tokens.completion_ids)
    ends = broken or aborted or (n_tokens is not None and n_tokens >= settings.session_max_tokens)
    if ends or not _store_open(factory, settings, session_id, idx, n_tokens, misuse, values):
        _known.drop(session_id)
        _store_locked(factory, settings, session_id, idx, values, n_tokens, broken, aborted)
    if broken:
        return Answer(502, {"error": {"message": error, "type": "upstream_error"}}, {})
    headers = {"x-grpo-curator-call": str(idx)}
    return Answer(result.status, for_agent(kind, body, result.payload), headers)


def storable(value: Any) -> Any:
    """``value`` with every NUL character in its strings (keys too) replaced by U+FFFD: PostgreSQL's text and
    jsonb hold no NUL, and a model may well generate one (a byte-level vocabulary has the byte). The token ids
    stay exact; only the stored text of the answer differs (the agent gets it as the upstream sent it)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value


def _answered(result: Forwarded, tokens: Tokens | None, error: str | None, misuse: str | None,
              policy_version: int) -> dict[str, Any]:
    """The call's row as answered (its placeholder's new values)."""
    response = None if tokens is None else {"message": tokens.message, "finish_reason": tokens.finish_reason}
    values: dict[str, Any] = {
        "attempts": max(result.attempts, 1), "latency_ms": result.latency_ms, "error": storable(error),
        "misuse": storable(misuse), "response": storable(response),
        "policy_version": result.policy_version if result.policy_version is not None else policy_version,
    }
    if tokens is not None:
        values.update(prompt_ids=arrays.encode(tokens.prompt_ids, arrays.TOKEN_DTYPE),
                      completion_ids=arrays.encode(tokens.completion_ids, arrays.TOKEN_DTYPE),
                      logprobs=arrays.encode(tokens.logprobs, arrays.LOGPROB_DTYPE), finish_reason=tokens.finish_reason)
    else:  # as the placeholder holds them
        values.update(prompt_ids=None, completion_ids=None, logprobs=None, finish_reason=None)
    return values


def _store_open(factory: sessionmaker[Session], settings: Settings, session_id: str, idx: int, n_tokens: int | None,
                misuse: str | None, values: dict[str, Any]) -> bool:
    """An answer that ends nothing, stored in one statement that is its own transaction (autocommit: committed
    when it returns, so before the answer goes back): the session's row, while it is open, then the call's.
    False, with nothing written, when the session is open no more, or its tokens (an answer without any) are
    at the limit: ``_store_locked`` decides then. The session's known slot (``_known``) takes its calls and
    tokens as stored."""
    with factory() as db:
        db.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        stored = repo.store_answer(db, session_id, idx, n_tokens, misuse, values, settings.session_max_tokens)
        db.commit()
    known = _known.get(session_id)
    if known is not None and stored is not None:
        _leave(known, *stored)
    return stored is not None


def _store_locked(factory: sessionmaker[Session], settings: Settings, session_id: str, idx: int,
                  values: dict[str, Any], n_tokens: int | None, broken: bool, aborted: bool) -> None:
    """The answer stored with the session row locked, when it may end the session: the upstream broke or
    aborted, the tokens reached the limit, or the session ended while the call was in flight (409: its
    answer discarded, the call kept as not answered)."""
    with factory.begin() as db:
        row = repo.get_session(db, session_id, lock=True)
        assert row is not None
        placeholder = repo.get_call(db, session_id, idx)
        if placeholder is None:  # never, its reservation committed first; refused rather than stored elsewhere
            raise ServiceError(f"session_id: call {idx}'s reservation was lost (the database restarted while it was "
                               "in flight); nothing of it was stored, call again", status_code=503)
        placeholder.attempts, placeholder.latency_ms = values["attempts"], values["latency_ms"]
        if row.status != "open":  # the session ended while the call was in flight: nothing of it kept
            placeholder.error = (f"not answered: the session ended ({row.finish_reason}) while this call was in "
                                 "flight; its answer was discarded")
            ended_as = row.finish_reason
        else:
            ended_as = None
            for field, value in values.items():
                setattr(placeholder, field, value)
            if n_tokens is not None:
                row.n_tokens = n_tokens
            if values["misuse"] is not None and row.misuse is None:
                row.misuse = values["misuse"]
            ended = ("env_error" if broken else "aborted" if aborted
                     else "length" if row.n_tokens >= settings.session_max_tokens else None)
            if ended is not None:
                repo.lock_group(db, row.group_id)
                why = values["error"] if broken else f"the upstream aborted call {idx}" if aborted else None
                service.close(db, row, ended, why)
                group_service.ingest_if_complete(db, row.group_id, settings)
    if ended_as is not None:
        raise Conflict(f"session_id: the session ended ({ended_as}) while this call was in flight; its answer "
                       "was not kept", detail={"finish_reason": ended_as})
