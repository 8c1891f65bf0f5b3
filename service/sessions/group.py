"""A group of sessions -> a posted group (through ``service.ingest.service``, exactly like POST /v1/groups).

A group is ingested once every one of its ``group_size`` sessions finished, or once its deadline
(``session_group_deadline_s`` after its first session) passed: then the finished sessions form the group,
the open ones are closed as ``timeout`` (left out) -- except one whose calls already showed a tool misuse,
which ends as ``tool_misuse`` and is a member (the model's failure: a negative), and one whose model had
given its final answer, which ends as ``stop`` and is a member (its answer scored: not finishing is no way
out of a wrong answer, ``ending.settle``) -- and the sessions never started are counted as missing.
Each session becomes one trajectory (``service.sessions.trajectory`` joins its calls): a session whose
agent rewrote its history is one trajectory of several ``segments`` (docs/api.md), never a corrupted one.

A resume session (``resume`` set) forms no group: its trajectory starts from its slot's checkpoint and, on
finish, fills that slot of the waiting group (``POST /v1/groups/{id}/trajectories/{index}``'s rule,
``service.curation.remedies.fill_slot``), the checkpoint's tokens keeping their versions, the new ones
tagged with the version of the call that generated them.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from service.api.errors import BadRequest, Conflict, NotFound, ServiceError
from service.auth.service import Principal, Role
from service.curation import service as curation
from service.ingest import service as ingest
from service.ingest.schemas import GroupIn, PromptIn, TrajectoryIn
from service.sessions import ending, sampling
from service.sessions import repository as repo
from service.sessions.repository import SEGMENT_MARK
from service.sessions.trajectory import Segment, TracedCall, segments
from service.settings import Settings
from service.store import arrays
from service.store.models import Group, SamplingRequest

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


def resume_slot(db: Session, group_id: str, idx: int, key: Principal) -> tuple[Group, SamplingRequest]:
    """The waiting group (locked) and the open resume request of its slot ``idx``, or the 4xx naming the
    ``resume`` field: 404 an unknown group (or one outside the key's datasets), 422 an index outside it,
    409 a slot that awaits no resume."""
    g = ingest.lock_group(db, group_id)
    if g is None or not key.allows_dataset(g.dataset):
        raise NotFound(f"resume.group_id: no group {group_id!r}")
    if idx >= g.n_trajectories:
        raise BadRequest(f"resume.index: group {group_id!r} has trajectories 0 to {g.n_trajectories - 1}, got {idx}")
    request = curation.open_resume_request(db, g.pk, idx)
    if g.status != "waiting" or request is None:
        raise Conflict(f"resume.index: slot {idx} of group {group_id!r} is not awaiting a resume "
                       f"(group status {g.status!r})", detail={"group_id": group_id, "index": idx, "status": g.status})
    return g, request


def fill_resume(db: Session, s: Any, settings: Settings) -> bool:
    """A finished resume session -> its slot filled (True), or why not recorded on the session (False: the
    slot stays open until its deadline). Either way the session is done (``ingested_at`` set)."""
    slot = s.resume
    req = db.get(SamplingRequest, slot["request_id"])
    checkpoint = (req.checkpoint if req is not None else None) or {}
    calls = repo.calls(db, s.id)
    key = Principal(s.producer_key, Role(s.producer_role),
                    None if s.producer_datasets is None else frozenset(s.producer_datasets))
    filled = False
    try:
        t = session_trajectory(s, calls, checkpoint=checkpoint)
        if t.segments is not None:
            mismatch = (t.metadata.get("prefix_mismatch") or [None, None])[1]
            raise BadRequest(f"resume: call {mismatch and mismatch['call']}'s prompt ids do not extend the "
                             f"checkpoint (first difference at {mismatch and mismatch['position']}); a segmented "
                             "continuation cannot fill a resume slot")
        # the policy that posts the fill is the newest that generated any of its tokens: the upstream's
        # weights may have moved during the continuation (its calls are tagged with the version it reported)
        version = max([s.policy_version, *(t.versions or ())])
        with db.begin_nested():
            curation.fill_slot(db, slot["group_id"], slot["index"], version, t,
                               max_sequence_tokens=settings.max_sequence_tokens, key=key)
        filled = True
    except (ServiceError, ValidationError) as exc:  # never a 500 at finish: recorded on the session
        log.warning("sessions: resume session %r did not fill its slot: %s", s.id, exc)
        s.error = f"resume: {exc}"[:10_000]
        db.flush()
    repo.mark_ingested(db, [s.id])
    return filled


def ingest_if_complete(db: Session, group_id: str, settings: Settings) -> bool:
    """Post the group when it is complete or overdue (the caller holds the group's lock); a resume
    session fills its slot instead (``fill_resume``)."""
    sessions = repo.group_sessions(db, group_id)
    if not sessions or any(s.ingested_at is not None or s.status == "failed" for s in sessions):
        return False
    first = sessions[0]
    if first.resume is not None:
        if first.status == "open":
            overdue = (repo.now(db) - first.created_at).total_seconds() > settings.session_group_deadline_s
            if not overdue:
                return False
            _end(db, first, "timeout")
            if first.finish_reason == "timeout":
                first.error = "the deadline passed before this resume session finished; its slot was not filled"
                repo.mark_ingested(db, [first.id])
                return False
        return fill_resume(db, first, settings)
    overdue = (repo.now(db) - first.created_at).total_seconds() > settings.session_group_deadline_s
    finished = [s for s in sessions if s.status == "finished"]
    complete = len(finished) == first.group_size
    if not (complete or overdue):
        return False
    for s in sessions:
        if s.status == "open":  # overdue: ended so it takes no more calls
            _end(db, s, "timeout")
            if s.finish_reason == "timeout":  # left out of the group (the environment's deadline: no negative)
                s.error = "the group's deadline passed before this session finished"
            else:  # its calls showed the model's misuse or its final answer: a member, scored
                finished.append(s)
    if not finished:  # nobody finished by the deadline: nothing to post, never retried
        _fail(db, sessions, "the group's deadline passed before any session finished; the group was not posted")
        return False
    left_out = [s.id for s in sessions if s not in finished]
    missing = first.group_size - len(sessions)
    try:
        group = _group(db, first, finished, left_out, missing)
    except ValidationError as exc:  # never a 500 at finish: recorded on each session, the group not posted
        log.warning("sessions: group %r is not a valid group: %s", group_id, exc)
        _fail(db, sessions, f"ingest: {exc}")
        return False
    key = Principal(first.producer_key, Role(first.producer_role),
                    None if first.producer_datasets is None else frozenset(first.producer_datasets))
    try:
        with db.begin_nested():
            ingest.ingest_groups(db, [group], max_group_size=settings.max_group_size,
                                 max_sequence_tokens=settings.max_sequence_tokens, batched=False, key=key,
                                 caller_specs=frozenset(settings.caller_reference_specs))
    except ServiceError as exc:  # the sessions stay; the group is not posted (recorded on each session)
        log.warning("sessions: group %r could not be ingested: %s", group_id, exc)
        _fail(db, sessions, f"ingest: {exc}")
        return False
    repo.mark_ingested(db, [s.id for s in sessions])
    return True


def _end(db: Session, s: Any, reason: str) -> None:
    """End an open session as ``reason`` (a tool misuse the gateway saw still ends it as ``tool_misuse``, a
    session whose model gave its final answer as ``stop``: ``ending.settle``)."""
    s.finish_reason = ending.settle(db, s, reason)
    s.status, s.finished_at = "finished", repo.now(db)


def _fail(db: Session, sessions: list[Any], error: str) -> None:
    """The group cannot be posted: recorded on each session (status ``failed``, ``error``), never retried (the
    sweep and every finish skip a group with a failed session) and never a new member."""
    for s in sessions:
        s.status, s.error = "failed", error[:10_000]
        if s.finished_at is None:
            s.finished_at = repo.now(db)
    db.flush()


def _group(db: Session, first: Any, finished: list[Any], left_out: list[str], missing: int) -> GroupIn:
    trajectories, temperature = [], None
    for s in finished:
        calls = repo.calls(db, s.id)
        if temperature is None:
            temperature = next((c.request.get("temperature") for c in calls if c.completion_ids is not None), None)
        trajectories.append(session_trajectory(s, calls))
    # the group's version is the newest that generated any of its tokens (an upstream answering at another
    # version than the session's tags its tokens with it, metadata.policy_version_mismatch): staleness is
    # counted from it, and no token's version is ever newer than its group's (ingest's version rule)
    newest = max((v for t in trajectories for v in (t.versions or ())), default=first.policy_version)
    return GroupIn(
        id=first.group_id, prompt_id=first.prompt_id, policy_version=max(first.policy_version, newest),
        prompt=PromptIn.model_validate(first.prompt) if first.prompt is not None else None,
        sampling=sampling.recorded(sampling.temperature({"temperature": temperature})), trajectories=trajectories,
        metadata={"source": "sessions", "sessions": [s.id for s in finished], "left_out_sessions": left_out,
                  "missing_sessions": missing},
    )


def _traced(calls: list[Any], default_version: int = -1) -> list[TracedCall]:
    out, marked = [], False
    for c in calls:
        if c.kind == SEGMENT_MARK:  # the agent's segment mark: the next answered call starts a segment
            marked = True
            continue
        if c.prompt_ids is None or c.completion_ids is None or c.logprobs is None:
            continue  # a failed or refused call: nothing was generated
        out.append(TracedCall(c.idx, arrays.decode_list(c.prompt_ids, arrays.TOKEN_DTYPE),
                              arrays.decode_list(c.completion_ids, arrays.TOKEN_DTYPE),
                              arrays.decode_list(c.logprobs, arrays.LOGPROB_DTYPE),
                              c.policy_version if c.policy_version is not None else default_version,
                              new_segment=marked))
        marked = False
    return out


def _seed(checkpoint: dict[str, Any]) -> Segment:
    """A resume's checkpoint as the start of the session's first segment."""
    ids = list(checkpoint.get("token_ids") or [])
    versions = checkpoint.get("versions")
    return Segment(token_ids=ids, loss_mask=list(checkpoint.get("loss_mask") or []),
                   logprobs=[float(x) for x in checkpoint.get("logprobs") or []],
                   versions=list(versions) if versions is not None else [-1] * len(ids))


def _boundary(seg: Segment, calls: list[Any]) -> dict[str, int] | None:
    """``metadata.checkpoint`` of a one-segment session: the state before its last call's completion (every
    tool result the model saw is in it; docs/curation.md "Resume"), so a cut member resumes from there."""
    if not seg.calls:
        return None
    last = next(c for c in calls if c.idx == seg.calls[-1])
    n = len(arrays.decode_list(last.completion_ids, arrays.TOKEN_DTYPE) or ())
    tokens = len(seg.token_ids) - n
    if tokens <= 0:
        return None
    history = last.request.get("messages") if last.kind == "chat" else None
    return {"tokens": tokens, "messages": len(history) if isinstance(history, list) else 0}


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


def session_trajectory(s: Any, calls: list[Any], checkpoint: dict[str, Any] | None = None) -> TrajectoryIn:
    """A session -> one trajectory: its one segment's arrays at the top level, or (the agent rewrote its
    history) ``segments`` in order, each with the messages its last call held. A resume session's
    ``checkpoint`` starts its first segment, and the trajectory carries per-token ``versions``."""
    seed = _seed(checkpoint) if checkpoint is not None else None
    traced = _traced(calls, s.policy_version)
    segs: list[Segment] = segments(traced, seed)
    other = sorted({c.version for c in traced if c.version != s.policy_version})
    text, messages = _answer(calls)
    if checkpoint is not None and not any(c.response is not None for c in calls):
        messages = list(checkpoint.get("messages") or [])  # no answered call: the checkpoint's state
    final = s.final_answer if s.final_answer is not None else text
    base = {**s.rewards, **s.metadata_, "session_id": s.id}  # rewards never override (checked at finish)
    if s.misuse:
        base["tool_misuse"] = s.misuse
    if other:  # an upstream answered with another policy (its x-policy-version): flagged, tokens tagged
        base["policy_version_mismatch"] = {"session": s.policy_version, "upstream": other}
    fields: dict[str, Any] = {"final_answer": final, "finish_reason": s.finish_reason, "metadata": base}
    if len(segs) == 1:
        (seg,) = segs
        meta = {**base, "calls": seg.calls}
        boundary = _boundary(seg, calls)
        if boundary is not None:
            meta["checkpoint"] = boundary
        if checkpoint is not None:
            meta["resumed_from"] = {**s.resume, "checkpoint_tokens": len(checkpoint.get("token_ids") or [])}
        if checkpoint is not None or other:
            fields["versions"] = seg.versions
        fields.update(token_ids=seg.token_ids, loss_mask=seg.loss_mask, logprobs=seg.logprobs, metadata=meta)
    elif segs:
        by_index = {c.idx: c for c in calls}
        fields["metadata"] = {**base, "calls": [seg.calls for seg in segs],
                              "prefix_mismatch": [seg.prefix_mismatch for seg in segs],
                              "segment_marks": [seg.calls[0] for seg in segs if seg.marked]}
        fields["segments"] = [  # every traced call has log-probs: all segments carry them
            {"token_ids": seg.token_ids, "loss_mask": seg.loss_mask, "logprobs": seg.logprobs,
             "messages": _answer([by_index[i] for i in seg.calls])[1]} for seg in segs
        ]
    return _validated(fields, messages)


def _validated(fields: dict[str, Any], messages: list[Any]) -> TrajectoryIn:
    try:
        return TrajectoryIn.model_validate({**fields, "messages": messages})
    except ValidationError:  # the agent's history does not fit the wire's message type: the tokens still do
        if fields.get("segments"):
            fields = {**fields, "segments": [{k: v for k, v in seg.items() if k != "messages"}
                                             for seg in fields["segments"]]}
        return TrajectoryIn.model_validate(fields)
