"""Sessions: create, authorize, finish, read. Forwarding is ``gateway``; the group's ingest ``group``.

A session's key is ``gcs_<session id>_<secret>`` (only sha256(secret) is stored): it is valid for that
one session's routes and nothing else. A session's routes also admit API keys (producer for calls and
finish, viewer to read) whose datasets include the session's.
"""

from __future__ import annotations

import hmac
import secrets
from datetime import datetime
from typing import Any

from fastapi import Request
from sqlalchemy.orm import Session

from filters.types import ENVIRONMENT_REASONS
from service.api.errors import BadRequest, Conflict, Forbidden, NotFound, Unauthorized
from service.auth.service import PRODUCER, VIEWER, Principal, Role, authenticate, hash_secret
from service.ingest import service as ingest
from service.sessions import group as group_service
from service.sessions import repository as repo
from service.sessions.schemas import CallOut, FinishIn, FinishOut, SessionCreated, SessionIn, SessionOut
from service.sessions.upstream import sticky, upstream_urls
from service.settings import Settings
from service.store import arrays

SESSION_PREFIX = "gcs_"


def new_session_token() -> tuple[str, str, str]:
    session_id, secret = secrets.token_hex(16), secrets.token_urlsafe(32)
    return session_id, hash_secret(secret), f"{SESSION_PREFIX}{session_id}_{secret}"


def create_session(db: Session, body: SessionIn, key: Principal, settings: Settings, root: str) -> SessionCreated:
    urls = upstream_urls(settings.inference_url)
    if not urls:
        raise BadRequest("GRPO_CURATOR_INFERENCE_URL: the deployment names no upstream inference server",
                         status_code=503)
    assert body.prompt_id is not None
    if body.prompt is not None:
        key.check_dataset(body.prompt.dataset, "prompt.dataset")
        ingest.check_refs(db, body.prompt, "prompt.")  # refused now, not when its group is posted
        ingest.check_reference_source(db, [("prompt.", body.prompt)], key, frozenset(settings.caller_reference_specs))
        ingest.check_reference(db, [("prompt.", body.prompt)])
        dataset: str | None = body.prompt.dataset
    else:
        dataset = repo.prompt_dataset(db, body.prompt_id)
        if dataset is None or not key.allows_dataset(dataset):
            raise BadRequest(f"prompt_id: unknown prompt {body.prompt_id!r}; post it to /v1/prompts first or "
                             "send 'prompt' inline", status_code=422)
    group_service.sweep(db, settings)  # groups past their deadline go in with the sessions they have
    repo.lock_group(db, body.group_id)
    _check_group(db, body)
    session_id, digest, token = new_session_token()
    repo.insert_session(db, {
        "id": session_id, "secret_hash": digest, "group_id": body.group_id, "group_size": body.group_size,
        "prompt_id": body.prompt_id, "prompt": body.prompt.model_dump(mode="json") if body.prompt else None,
        "dataset": dataset, "policy_version": body.policy_version, "metadata_": body.metadata,
        "producer_key": key.name, "producer_role": key.role.value,
        "producer_datasets": sorted(key.datasets) if key.datasets is not None else None,
        "upstream": sticky(urls, session_id), "rewards": {},
    })
    return SessionCreated(session_id=session_id, base_url=f"{root}v1/sessions/{session_id}", api_key=token)


def _check_group(db: Session, body: SessionIn) -> None:
    sessions = repo.group_sessions(db, body.group_id)
    if not sessions:
        if group_service.group_exists(db, body.group_id):
            raise Conflict(f"group_id: group {body.group_id!r} already exists", detail={"group_id": body.group_id})
        return
    first = sessions[0]
    for field in ("group_size", "prompt_id", "policy_version"):
        if getattr(first, field) != getattr(body, field):
            raise Conflict(f"{field}: differs from the group's other sessions ({getattr(first, field)!r})",
                           detail={"group_id": body.group_id, "field": field})
    if any(s.ingested_at is not None for s in sessions) or len(sessions) >= body.group_size:
        raise Conflict(f"group_id: group {body.group_id!r} has all its {body.group_size} sessions",
                       detail={"group_id": body.group_id})


# -- who may use a session -----------------------------------------------------------------------------
def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else header


def authorize(request: Request, db: Session, session_id: str, need: Role, lock: bool = False) -> Any:
    """The session row, when the caller holds its key (or an API key of ``need`` or admin whose datasets
    include the session's). Unknown session: 404 for every caller (ids are 128-bit random)."""
    row = repo.get_session(db, session_id, lock=lock)
    if row is None:
        raise NotFound(f"session_id: no session {session_id!r}")
    token = _bearer(request)
    if token is not None and token.startswith(SESSION_PREFIX):
        sid, sep, secret = token[len(SESSION_PREFIX):].partition("_")
        if sid != session_id:
            raise Forbidden("authorization: this session key belongs to another session")
        if not sep or not hmac.compare_digest(hash_secret(secret), row.secret_hash):
            raise Unauthorized("authorization: wrong session key")
        return row
    key = authenticate(request, db)  # an API key (or auth off); ends the read transaction
    if not (key.is_admin or key.role == need or (need == VIEWER and key.role in (PRODUCER, Role.trainer))):
        raise Forbidden(f"authorization: role {key.role.value!r} may not use this route (session key, "
                        f"{need.value} or admin)")
    if row.dataset is not None and not key.allows_dataset(row.dataset):
        raise NotFound(f"session_id: no session {session_id!r}")
    return repo.get_session(db, session_id, lock=lock)


# -- finish ----------------------------------------------------------------------------------------------
def end_reason(row: Any, asked: str | None, error: str | None, elapsed_s: float, settings: Settings) -> str:
    """The session's finish_reason: an environment failure wins (never a negative); then the model's tool
    misuse the gateway saw (a right negative); then the wall-time limit; then what the agent said."""
    if asked in ENVIRONMENT_REASONS:
        return asked
    if asked is None and error is not None:
        return "env_error"
    if row.misuse is not None:
        return "tool_misuse"
    if elapsed_s > settings.session_max_seconds:
        return "timeout"
    return asked or "stop"


def close(db: Session, row: Any, reason: str, error: str | None = None) -> None:
    row.status, row.finish_reason, row.finished_at = "finished", reason, repo.now(db)
    if error is not None:
        row.error = error
    db.flush()


def finish(request: Request, db: Session, session_id: str, body: FinishIn, settings: Settings) -> FinishOut:
    row = authorize(request, db, session_id, PRODUCER, lock=True)
    repo.lock_group(db, row.group_id)
    row = repo.get_session(db, session_id, lock=True)
    if row.status == "open":
        elapsed = (repo.now(db) - row.created_at).total_seconds()
        row.final_answer = body.final_answer
        row.rewards = body.rewards
        close(db, row, end_reason(row, body.finish_reason, body.error, elapsed, settings), body.error)
    ingested = group_service.ingest_if_complete(db, row.group_id, settings)
    return FinishOut(session_id=row.id, status=row.status, finish_reason=row.finish_reason or "stop",
                     group_ingested=ingested)


# -- read ------------------------------------------------------------------------------------------------
def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def get(request: Request, db: Session, session_id: str, include_tokens: bool) -> SessionOut:
    row = authorize(request, db, session_id, VIEWER)
    calls = []
    for c in repo.calls(db, session_id):
        prompt = arrays.decode_list(c.prompt_ids, arrays.TOKEN_DTYPE)
        completion = arrays.decode_list(c.completion_ids, arrays.TOKEN_DTYPE)
        calls.append(CallOut(
            index=c.idx, kind=c.kind, finish_reason=c.finish_reason, prompt_tokens=len(prompt or ()),
            completion_tokens=len(completion or ()), latency_ms=c.latency_ms, attempts=c.attempts,
            policy_version=c.policy_version, error=c.error, misuse=c.misuse, created_at=c.created_at.isoformat(),
            prompt_token_ids=prompt if include_tokens else None,
            completion_token_ids=completion if include_tokens else None,
            logprobs=arrays.decode_list(c.logprobs, arrays.LOGPROB_DTYPE) if include_tokens else None,
        ))
    return SessionOut(
        session_id=row.id, group_id=row.group_id, group_size=row.group_size, prompt_id=row.prompt_id,
        policy_version=row.policy_version, status=row.status, finish_reason=row.finish_reason,
        final_answer=row.final_answer, error=row.error, misuse=row.misuse, n_calls=row.n_calls,
        n_tokens=row.n_tokens, created_at=row.created_at.isoformat(), finished_at=_iso(row.finished_at),
        ingested=row.ingested_at is not None, calls=calls,
    )
