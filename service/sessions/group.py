"""A group of sessions -> a posted group (through ``service.ingest.service``, exactly like POST /v1/groups).

A group is ingested once every one of its ``group_size`` sessions finished, or once its deadline
(``session_group_deadline_s`` after its first session) passed: then the finished sessions form the group,
the open ones are closed as ``timeout`` (left out) and the sessions never started are counted as missing.
Each session becomes one trajectory per segment (``service.sessions.trajectory``): a session whose agent
rewrote its history is several trajectories, never a corrupted one.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from service.api.errors import ServiceError
from service.auth.service import Principal, Role
from service.ingest import service as ingest
from service.ingest.schemas import GroupIn, PromptIn, TrajectoryIn
from service.sessions import repository as repo
from service.sessions.trajectory import Segment, TracedCall, segments
from service.settings import Settings
from service.store import arrays

log = logging.getLogger(__name__)


def group_exists(db: Session, group_id: str) -> bool:
    return repo.group_exists(db, group_id)


def sweep(db: Session, settings: Settings) -> int:
    """Ingest every group past its deadline; returns how many were."""
    done = 0
    for group_id in repo.overdue_groups(db, settings.session_group_deadline_s):
        repo.lock_group(db, group_id)
        done += ingest_if_complete(db, group_id, settings)
    return done


def ingest_if_complete(db: Session, group_id: str, settings: Settings) -> bool:
    """Post the group when it is complete or overdue (the caller holds the group's lock)."""
    sessions = repo.group_sessions(db, group_id)
    if not sessions or any(s.ingested_at is not None for s in sessions):
        return False
    first = sessions[0]
    overdue = (repo.now(db) - first.created_at).total_seconds() > settings.session_group_deadline_s
    finished = [s for s in sessions if s.status == "finished"]
    complete = len(finished) == first.group_size
    if not (complete or (overdue and finished)):
        return False
    for s in sessions:
        if s.status == "open":  # overdue: left out of the group, and ended so it takes no more calls
            s.status, s.finish_reason, s.finished_at = "finished", "timeout", repo.now(db)
            s.error = "the group's deadline passed before this session finished"
    left_out = [s.id for s in sessions if s not in finished]
    missing = first.group_size - len(sessions)
    group = _group(db, first, finished, left_out, missing)
    key = Principal(first.producer_key, Role(first.producer_role),
                    None if first.producer_datasets is None else frozenset(first.producer_datasets))
    try:
        with db.begin_nested():
            ingest.ingest_groups(db, [group], max_group_size=settings.max_group_size,
                                 max_sequence_tokens=settings.max_sequence_tokens, batched=False, key=key,
                                 caller_specs=frozenset(settings.caller_reference_specs))
    except ServiceError as exc:  # the sessions stay; the group is not posted (recorded on each session)
        log.warning("sessions: group %r could not be ingested: %s", group_id, exc)
        for s in sessions:
            s.error = f"ingest: {exc}"[:10_000]
        db.flush()
        return False
    repo.mark_ingested(db, [s.id for s in sessions])
    return True


def _group(db: Session, first: Any, finished: list[Any], left_out: list[str], missing: int) -> GroupIn:
    trajectories, temperature = [], None
    for s in finished:
        calls = repo.calls(db, s.id)
        if temperature is None:
            temperature = next((c.request.get("temperature") for c in calls if c.completion_ids is not None), None)
        trajectories += session_trajectories(s, calls)
    sampling: dict[str, Any] = {"temperature": temperature if isinstance(temperature, int | float) else 1.0}
    return GroupIn(
        id=first.group_id, prompt_id=first.prompt_id, policy_version=first.policy_version,
        prompt=PromptIn.model_validate(first.prompt) if first.prompt is not None else None,
        sampling=sampling, trajectories=trajectories,
        metadata={"source": "sessions", "sessions": [s.id for s in finished], "left_out_sessions": left_out,
                  "missing_sessions": missing},
    )


def _traced(calls: list[Any]) -> list[TracedCall]:
    out = []
    for c in calls:
        if c.prompt_ids is None or c.completion_ids is None or c.logprobs is None:
            continue  # a failed or refused call: nothing was generated
        out.append(TracedCall(c.idx, arrays.decode_list(c.prompt_ids, arrays.TOKEN_DTYPE),
                              arrays.decode_list(c.completion_ids, arrays.TOKEN_DTYPE),
                              arrays.decode_list(c.logprobs, arrays.LOGPROB_DTYPE)))
    return out


def _answer(calls: list[Any]) -> tuple[str, list[dict[str, Any]]]:
    """The last answered call's assistant text, and the conversation it closes (when it is a chat)."""
    for c in reversed(calls):
        if c.response is None:
            continue
        message = c.response.get("message") or {}
        content = message.get("content")
        text = content if isinstance(content, str) else ""
        history = list(c.request.get("messages") or []) if c.kind == "chat" else []
        return text, history + [{k: v for k, v in message.items() if v is not None} | {"role": "assistant"}]
    return "", []


def session_trajectories(s: Any, calls: list[Any]) -> list[TrajectoryIn]:
    segs: list[Segment] = segments(_traced(calls))
    text, messages = _answer(calls)
    final = s.final_answer if s.final_answer is not None else text
    base = {**s.metadata_, **s.rewards, "session_id": s.id}
    if s.misuse:
        base["tool_misuse"] = s.misuse
    if not segs:
        return [TrajectoryIn(final_answer=final, finish_reason=s.finish_reason,
                             metadata={**base, "segment": 0, "segments": 0})]
    out = []
    for i, seg in enumerate(segs):
        meta = {**base, "segment": i, "segments": len(segs), "calls": seg.calls}
        if seg.prefix_mismatch is not None:
            meta["prefix_mismatch"] = seg.prefix_mismatch
        out.append(_trajectory(seg, final, s.finish_reason, meta, messages if i == len(segs) - 1 else []))
    return out


def _trajectory(seg: Segment, final: str, reason: str, meta: dict[str, Any], messages: list[Any]) -> TrajectoryIn:
    fields = dict(final_answer=final, token_ids=seg.token_ids, loss_mask=seg.loss_mask, logprobs=seg.logprobs,
                  finish_reason=reason, metadata=meta)
    try:
        return TrajectoryIn.model_validate({**fields, "messages": messages})
    except ValidationError:  # the agent's history does not fit the wire's message type: the tokens still do
        return TrajectoryIn.model_validate(fields)
