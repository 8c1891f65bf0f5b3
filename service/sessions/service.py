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
from service.sessions import ending
from service.sessions import group as group_service
from service.sessions import repository as repo
from service.sessions.schemas import (
    CallOut,
    FinishIn,
    FinishOut,
    SegmentOut,
    SessionCreated,
    SessionIn,
    SessionOut,
)
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
    if body.resume is not None:
        return _create_resume(db, body, key, urls, root)
    assert body.prompt_id is not None and body.group_id is not None and body.group_size is not None
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
    repo.lock_group(db, body.group_id)  # only its own group: other overdue groups are the worker's sweep
    _check_group(db, body, settings)
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


def _create_resume(db: Session, body: SessionIn, key: Principal, urls: list[str], root: str) -> SessionCreated:
    """A session that continues a cut member from its resume slot's checkpoint (docs/agents.md, "Resume a
    cut member"): its trajectory starts from the checkpoint and its finish fills the slot."""
    assert body.resume is not None
    gid, idx = body.resume.group_id, body.resume.index
    g, req = group_service.resume_slot(db, gid, idx, key)  # the group row locked: one create at a time
    slot_group = f"{gid}#resume/{idx}/{req.pk}"
    if any(s.status == "open" for s in repo.group_sessions(db, slot_group)):
        raise Conflict(f"resume.index: slot {idx} of group {gid!r} is being resumed by an open session; finish "
                       "it (or wait for its deadline) before starting another", detail={"group_id": gid, "index": idx})
    checkpoint = dict(req.checkpoint or {})
    if checkpoint.get("logprobs") is None:
        raise BadRequest(f"resume.index: the checkpoint of slot {idx} of group {gid!r} has no logprobs; the "
                         "gateway cannot continue it (fill the slot with POST /v1/groups/{id}/trajectories/"
                         "{index})", status_code=422)
    session_id, digest, token = new_session_token()
    repo.insert_session(db, {
        # a group id of its own: the slot's group is posted already, this session never forms one
        "id": session_id, "secret_hash": digest, "group_id": slot_group, "group_size": 1,
        "prompt_id": g.prompt_id, "prompt": None, "dataset": g.dataset, "policy_version": body.policy_version,
        "metadata_": body.metadata, "producer_key": key.name, "producer_role": key.role.value,
        "producer_datasets": sorted(key.datasets) if key.datasets is not None else None,
        "upstream": sticky(urls, session_id), "rewards": {},
        "resume": {"group_id": gid, "index": idx, "request_id": req.pk},
    })
    return SessionCreated(session_id=session_id, base_url=f"{root}v1/sessions/{session_id}", api_key=token,
                          checkpoint=checkpoint)


def _check_group(db: Session, body: SessionIn, settings: Settings) -> None:
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
    age = (repo.now(db) - first.created_at).total_seconds()
    if age > settings.session_group_deadline_s or any(s.status == "failed" for s in sessions):
        raise Conflict(f"group_id: group {body.group_id!r} is past its deadline "
                       f"(GRPO_CURATOR_SESSION_GROUP_DEADLINE_S) or failed to post; it takes no new session",
                       detail={"group_id": body.group_id})
    if any(s.ingested_at is not None for s in sessions) or len(sessions) >= body.group_size:
        raise Conflict(f"group_id: group {body.group_id!r} has all its {body.group_size} sessions",
                       detail={"group_id": body.group_id})


def sweep_overdue(db: Session, settings: Settings | None = None) -> int:
    """The worker's periodic maintenance: every group past ``session_group_deadline_s`` enters scoring
    with its finished sessions (the rule is ``group.sweep``); returns how many groups were ingested."""
    from service.settings import get_settings

    return group_service.sweep(db, settings or get_settings())


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
    if admit(request, db, row, session_id, need):
        return row
    return repo.get_session(db, session_id, lock=lock)


def _session_token(request: Request) -> str | None:
    token = _bearer(request)
    return token if token is not None and token.startswith(SESSION_PREFIX) else None


def holds_session_key(request: Request) -> bool:
    """Whether the caller sends a session key (``admit`` checks it against the session's row, reading nothing)."""
    return _session_token(request) is not None


def admit(request: Request, db: Session, row: Any, session_id: str, need: Role) -> bool:
    """``authorize``'s check of a row already read (None: an unknown session, 404). True for the session's
    own key (the transaction goes on); False for an API key, whose lookup ended the transaction
    (``authenticate``): the caller reads the row again, and locks it again."""
    if row is None:
        raise NotFound(f"session_id: no session {session_id!r}")
    token = _session_token(request)
    if token is not None:
        sid, sep, secret = token[len(SESSION_PREFIX):].partition("_")
        if sid != session_id:
            raise Forbidden("authorization: this session key belongs to another session")
        if not sep or not hmac.compare_digest(hash_secret(secret), row.secret_hash):
            raise Unauthorized("authorization: wrong session key")
        return True
    key = authenticate(request, db)  # an API key (or auth off); ends the read transaction
    if not (key.is_admin or key.role == need or (need == VIEWER and key.role in (PRODUCER, Role.trainer))):
        raise Forbidden(f"authorization: role {key.role.value!r} may not use this route (session key, "
                        f"{need.value} or admin)")
    if row.dataset is not None and not key.allows_dataset(row.dataset):
        raise NotFound(f"session_id: no session {session_id!r}")
    return False


# -- finish ----------------------------------------------------------------------------------------------
# keys the gateway writes into a session trajectory's metadata: no reward may take them either
GATEWAY_METADATA_KEYS = frozenset({"session_id", "tool_misuse", "calls", "checkpoint", "resumed_from",
                                   "prefix_mismatch", "source", "sessions", "left_out_sessions",
                                   "missing_sessions", "policy_version_mismatch", "segment_marks"})


def end_reason(row: Any, asked: str | None, error: str | None, record: ending.Record, elapsed_s: float,
               settings: Settings, submitted: bool = False) -> str:
    """The session's finish_reason: the model's tool misuse the gateway saw wins over anything the agent
    claims (a right negative); a session with no answered call is the environment's (nothing the model
    generated to train on); then the agent's claim, checked against the record (``ending.check_claim``: a 422
    naming ``finish_reason`` when it contradicts it): an environment failure (an ``error`` without a reason
    claims ``env_error``), never a negative; then the wall-time limit, unless the model had ended its episode
    (a late finish cuts nothing); then what the agent said. ``submitted``: the agent sends a ``final_answer``
    (it says the model's last plain answer ended the episode: ``ending.Record.final_for``)."""
    if row.misuse is not None:
        return "tool_misuse"
    if not record.answered:
        return "env_error"
    claimed = "env_error" if asked is None and error is not None else asked
    ending.check_claim(claimed, record, row.n_tokens >= settings.session_max_tokens,
                       named=None if asked is not None else "an error without a finish_reason (env_error)",
                       submitted=submitted)
    if claimed in ENVIRONMENT_REASONS:
        return claimed
    if elapsed_s > settings.session_max_seconds and not record.final_for(submitted):
        return "timeout"
    return claimed or "stop"


def close(db: Session, row: Any, reason: str, error: str | None = None) -> None:
    """End the session as ``reason``, except that a tool misuse the gateway saw always ends it as
    ``tool_misuse`` (the model's failure, whatever ends the session after it: a limit, the upstream, the
    deadline, the agent), and that after the model's final answer a limit or a failure only hit what came
    after it: it ends as ``stop``, the answer scored (``ending.settle``)."""
    reason = ending.settle(db, row, reason)
    row.status, row.finish_reason, row.finished_at = "finished", reason, repo.now(db)
    if error is not None:
        row.error = error
    db.flush()


def check_rewards(row: Any, rewards: dict[str, float]) -> None:
    """The producer's session metadata (and the gateway's own keys) are never agent-writable: a reward key
    that collides with one is a 422 naming it."""
    for k in rewards:
        if k in (row.metadata_ or {}) or k in GATEWAY_METADATA_KEYS:
            raise BadRequest(f"rewards.{k}: collides with a session metadata key (the producer's or the "
                             "gateway's); name the reward component otherwise", status_code=422)


ANSWER_OPENERS = frozenset(':=>([{"\'`*')


def _opens_answer(before: str) -> bool:
    """Whether an answer cut off after ``before`` keeps its value: whitespace or an opening delimiter."""
    return before.isspace() or before in ANSWER_OPENERS


def answered_texts(calls: list[Any]) -> list[str]:
    """The text the model generated in each answered call (chat content or completions text)."""
    out = []
    for c in calls:
        if c.completion_ids is None or c.response is None:
            continue
        content = (c.response.get("message") or {}).get("content")
        out.append(content if isinstance(content, str) else "")
    return out


def check_final_answer(final_answer: str | None, texts: list[str]) -> None:
    """The answer scored is the model's own last word: a ``final_answer`` must be the text of the session's
    last answered completion (both stripped of surrounding whitespace), or a suffix of it right after
    whitespace or a character that opens an answer (``: = > ( [ { " ' ` *``): ``"\\boxed{5}"`` or ``"5"`` out
    of ``"so it is 5"`` or ``"x=5"``, never ``"5"`` out of ``"15"``, ``"-5"``, ``"1.5"``, ``"10^5"`` or
    ``"3,5"`` (a sign, point, power or separator before it changes the value). The agent may cut the answer
    off the end of what the model said, never pick it out of the middle nor write its own."""
    if final_answer is None or not final_answer.strip():
        return
    answer, last = final_answer.strip(), (texts[-1] if texts else "").strip()
    cut = len(last) - len(answer)
    if last.endswith(answer) and (cut == 0 or _opens_answer(last[cut - 1])):
        return
    raise BadRequest("final_answer: not the end of the model's last completion in this session (send its "
                     "text, or a suffix of it that does not start inside a word; or leave it out to score the "
                     "last completion's text)", status_code=422)


def finish(request: Request, db: Session, session_id: str, body: FinishIn, settings: Settings) -> FinishOut:
    row = authorize(request, db, session_id, PRODUCER, lock=True)
    repo.lock_group(db, row.group_id)
    row = repo.get_session(db, session_id, lock=True)
    if row.status == "open":
        calls = repo.calls(db, session_id)
        check_rewards(row, body.rewards)
        check_final_answer(body.final_answer, answered_texts(calls))
        record = ending.record(calls)
        elapsed = (repo.now(db) - row.created_at).total_seconds()
        submitted = body.final_answer is not None and bool(body.final_answer.strip())
        reason = end_reason(row, body.finish_reason, body.error, record, elapsed, settings, submitted)  # checked first
        row.final_answer = body.final_answer
        row.rewards = body.rewards
        error = body.error
        if not record.answered and row.misuse is None:
            error = error or "no answered call: nothing the model generated to train on"
        close(db, row, reason, error)
    ingested = group_service.ingest_if_complete(db, row.group_id, settings)
    return FinishOut(session_id=row.id, status=row.status, finish_reason=row.finish_reason or "stop",
                     group_ingested=ingested)


# -- segment ---------------------------------------------------------------------------------------------
def segment(request: Request, db: Session, session_id: str) -> SegmentOut:
    """The agent's summary checkpoint: the session's next call starts a new segment of its one trajectory
    (stored as a call row of kind ``segment`` at the next index, so it is durable and ordered with the calls;
    it counts against no limit). A mark with no answered call since the last one changes nothing."""
    row = authorize(request, db, session_id, PRODUCER, lock=True)
    if row.status != "open":
        raise Conflict(f"session_id: the session has ended ({row.finish_reason})",
                       detail={"finish_reason": row.finish_reason})
    if row.resume is not None:
        raise Conflict("session_id: a resume session continues one checkpoint; it cannot be segmented",
                       detail={"session_id": session_id})
    calls = repo.calls(db, session_id)
    since = [c for c in calls[_last_mark(calls) + 1:] if c.completion_ids is not None]
    if since:
        repo.insert_call(db, {"session_id": session_id, "idx": row.n_calls, "kind": repo.SEGMENT_MARK,
                              "request": {}, "upstream": row.upstream, "attempts": 1, "latency_ms": 0.0})
        row.n_calls += 1
        calls = repo.calls(db, session_id)
    db.flush()
    marks = sum(c.kind == repo.SEGMENT_MARK for c in calls)
    return SegmentOut(session_id=session_id, marks=marks, marked=bool(since))


def _last_mark(calls: list[Any]) -> int:
    return max((i for i, c in enumerate(calls) if c.kind == repo.SEGMENT_MARK), default=-1)


# -- read ------------------------------------------------------------------------------------------------
def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def get(request: Request, db: Session, session_id: str, include_tokens: bool) -> SessionOut:
    row = authorize(request, db, session_id, VIEWER)
    calls, marks = [], 0
    for c in repo.calls(db, session_id):
        marks += c.kind == repo.SEGMENT_MARK
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
        session_id=row.id, group_id=row.resume["group_id"] if row.resume else row.group_id, group_size=row.group_size, prompt_id=row.prompt_id,
        policy_version=row.policy_version, status=row.status, finish_reason=row.finish_reason,
        final_answer=row.final_answer, error=row.error, misuse=row.misuse, n_calls=row.n_calls - marks,
        n_tokens=row.n_tokens, created_at=row.created_at.isoformat(), finished_at=_iso(row.finished_at),
        ingested=row.ingested_at is not None, calls=calls,
    )
