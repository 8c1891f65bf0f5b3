"""Remedies in place: a `resample` / `resume` member is replaced in its own group (docs/curation.md,
"Remedies").

- **Request.** Curation gives a group with remedy members that can still be remedied the status ``waiting``
  (until ``now + policy.resample_wait_seconds``) and one sampling request per slot: ``reason`` the action,
  ``source_group_pk`` / ``idx`` the slot, the budget with the larger ``max_tokens``; a resume request carries
  the member's ``checkpoint`` (messages, token ids, loss mask, log-probs, per-token versions so far).
- **Fill.** ``POST /v1/groups/{group_id}/trajectories/{index}`` stores the replacement in place of the member
  (its rewards and decision are gone); when no slot is left open the group goes back to ``received``: it is
  scored and curated with the replacement. The same body again is an idempotent 200; another body for a slot
  already filled, for a slot nobody waits for, or after the group's deadline (the database's clock) is a
  409. A resume fill carries loss_mask, log-probs and versions equal to the checkpoint's on its tokens (no
  log-probs at all when the checkpoint has none: no behaviour policy), adds at least one generated token,
  and tags that continuation with its ``policy_version``; every fill keeps the versions rule
  (``ingest.check_versions``).
- **Deadline.** The worker's maintenance (``expire_waits``) takes groups whose wait ran out: their unfilled
  slots are ``expired`` and the group trains with what it has (scored again when some slot was filled).
- **Bounds.** A slot is resampled once; it is resumed at most ``policy.max_resumes`` times (a member cut
  again is resumed again while that holds, then stays out of training like a resample member); an expired
  slot is never asked for again. A segmented member whose action is resume is resampled instead
  (``slot_remedy``).

Every step is a decision row (``rule``: remedy_requested, remedy_filled, remedy_unfilled, remedy_exhausted),
so ``GET /v1/groups/{id}`` shows the history and ``GET /v1/stats`` counts it by remedy.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from filters.rules import staleness_version
from filters.types import REMEDY_ACTIONS, TRAINED_ACTIONS, CurationPolicy
from service.api.errors import BadRequest, Conflict, NotFound
from service.auth.service import OPEN, Principal
from service.curation import repository as curate_repo
from service.ingest import service as ingest
from service.ingest.schemas import TrajectoryIn
from service.settings import get_settings
from service.stats import service as stats
from service.store import arrays
from service.store.db import db_now
from service.store.models import Group, SamplingRequest, Trajectory

REQUESTED, FILLED, UNFILLED, EXHAUSTED = "remedy_requested", "remedy_filled", "remedy_unfilled", "remedy_exhausted"
REMEDY_RULES: tuple[str, ...] = (REQUESTED, FILLED, UNFILLED, EXHAUSTED)
SlotHistory = dict[tuple[int, int], list[SamplingRequest]]


def log_decisions(session: Session, rows: list[dict[str, Any]]) -> None:
    """Insert decision-log rows; the remedy steps among them are counted in the stats rollup in the same
    transaction (``GET /v1/stats``' ``remedies``). Every decision row goes in through here."""
    curate_repo.insert_decisions(session, rows)
    stats.record_remedies(session, rows)


def limit_of(action: str, policy: CurationPolicy) -> int:
    """How many requests one slot may get for ``action``."""
    return policy.max_resumes if action == "resume" else 1


def can_remedy(history: list[SamplingRequest], action: str, policy: CurationPolicy) -> bool:
    """The slot may be asked for again: no request of it expired, and fewer than the bound were made."""
    if policy.resample_wait_seconds <= 0 or action not in REMEDY_ACTIONS:
        return False
    if any(r.status == "expired" for r in history):
        return False
    return sum(1 for r in history if r.reason == action) < limit_of(action, policy)


def was_remedied(history: list[SamplingRequest]) -> bool:
    """The slot was filled before (its member now is a replacement that was cut again)."""
    return any(r.filled_at is not None for r in history) and not any(r.status == "expired" for r in history)


def token_versions(t: Trajectory, policy_version: int) -> list[int] | None:
    """The stored per-token versions, else the group's version on mask-1 tokens and -1 elsewhere."""
    stored = arrays.decode_list(t.versions, arrays.VERSION_DTYPE)
    if stored is not None:
        return stored
    mask = arrays.decode_list(t.loss_mask, arrays.MASK_DTYPE)
    return None if mask is None else [policy_version if m else -1 for m in mask]


def checkpoint_of(g: Group, t: Trajectory) -> dict[str, Any]:
    """The last complete state of a member: its ``metadata.checkpoint`` marker (``tokens`` / ``messages``: the
    lengths at the last turn boundary, rollout.episodes) when valid, else everything it has so far."""
    ids = arrays.decode_list(t.token_ids, arrays.TOKEN_DTYPE) or []
    mask = arrays.decode_list(t.loss_mask, arrays.MASK_DTYPE) or []
    logps = arrays.decode_list(t.logprobs, arrays.LOGPROB_DTYPE)
    versions = token_versions(t, g.policy_version) or []
    messages = list(t.messages or [])
    marker = t.metadata_.get("checkpoint") if isinstance(t.metadata_, dict) else None
    k, m = len(ids), len(messages)
    if isinstance(marker, dict):
        tokens, msgs = marker.get("tokens"), marker.get("messages")
        if isinstance(tokens, int) and not isinstance(tokens, bool) and 0 < tokens <= len(ids):
            k = tokens
        if isinstance(msgs, int) and not isinstance(msgs, bool) and 0 <= msgs <= len(messages):
            m = msgs
    return {
        "messages": messages[:m],
        "token_ids": ids[:k],
        "loss_mask": mask[:k],
        "logprobs": None if logps is None else logps[:k],
        "versions": versions[:k],
    }


def checkpoint_tokens(t: Trajectory) -> int:
    """How many tokens a member's resume checkpoint keeps (``checkpoint_of``'s ``token_ids``, not decoded)."""
    marker = t.metadata_.get("checkpoint") if isinstance(t.metadata_, dict) else None
    tokens = marker.get("tokens") if isinstance(marker, dict) else None
    if isinstance(tokens, int) and not isinstance(tokens, bool) and 0 < tokens <= t.seq_len:
        return tokens
    return t.seq_len


def checkpoint_version(t: Trajectory, policy_version: int) -> int:
    """The oldest version that generated a token of a member's resume checkpoint (``policy_version`` when its
    tokens carry no versions: every generated one is its group's)."""
    versions = arrays.decode(t.versions, arrays.VERSION_DTYPE)
    if versions is None:
        return policy_version
    kept = versions[: checkpoint_tokens(t)]
    generated = kept[kept >= 0]
    return min(int(generated.min()), policy_version) if generated.size else policy_version


def _not_resumable(t: Trajectory, policy_version: int, trained_oldest: int) -> str | None:
    """Why a member cannot be resumed, or None."""
    if t.segments:
        return "a segmented member is resampled: it has no single context to resume"
    limit = get_settings().max_sequence_tokens
    if checkpoint_tokens(t) >= limit:
        return (f"resampled: its {checkpoint_tokens(t)}-token checkpoint leaves no room for a continuation "
                f"within max_sequence_tokens {limit}")
    oldest = checkpoint_version(t, policy_version)
    if oldest < trained_oldest:
        return (f"resampled: its checkpoint's tokens come from policy version {oldest}, older than every member "
                f"that trains ({trained_oldest}); a continuation would train them and make the group staler")
    return None


def slot_remedy(action: str, t: Trajectory, policy_version: int, trained_oldest: int) -> str:
    """The remedy a slot is asked for: its member's action, except that a member is resampled, not resumed,
    when resuming it cannot help its group -- a segmented member (its last complete state is its last
    segment's context, while its earlier segments were trained from contexts a continuation would never see;
    resuming it would join them into one that never existed), one whose checkpoint already fills the
    deployment's ``max_sequence_tokens`` (a continuation adds at least one token, so every fill would be a
    422 and the group would wait out its deadline for nothing), or one whose checkpoint is older than every
    member that trains (``trained_oldest``: the group's staleness version; the continuation would carry
    those old tokens into training and could make the completers stale)."""
    if action != "resume":
        return action
    return action if _not_resumable(t, policy_version, trained_oldest) is None else "resample"


def remedy_note(action: str, t: Trajectory, policy_version: int, trained_oldest: int) -> str:
    """Why ``slot_remedy`` asked for another remedy than the member's action ('' when it did not)."""
    why = _not_resumable(t, policy_version, trained_oldest) if action == "resume" else None
    return "" if why is None else f" ({why})"


def request_row(g: Group, idx: int, action: str, budget: dict[str, Any], dataset: str, trained_oldest: int
                ) -> dict[str, Any]:
    trajectory = next(t for t in g.trajectories if t.idx == idx)
    action = slot_remedy(action, trajectory, g.policy_version, trained_oldest)
    return {"prompt_id": g.prompt_id, "dataset": dataset, "reason": action, "n": 1, "budget": budget,
            "priority": 2.0, "source_group_pk": g.pk, "idx": idx,
            "checkpoint": checkpoint_of(g, trajectory) if action == "resume" else None}


def wait_until(policy: CurationPolicy, now: datetime) -> datetime:
    return now + timedelta(seconds=policy.resample_wait_seconds)


# -- the fill route --------------------------------------------------------------------------------------
def _f32(values: list[float]) -> bytes:
    return np.asarray(values, dtype=np.float32).tobytes()


def _check_resume(t: TrajectoryIn, checkpoint: dict[str, Any], policy_version: int) -> None:
    """A resumed trajectory extends its checkpoint by at least one generated token, keeping the checkpoint's
    tokens, mask, behaviour log-probs (bitwise as stored, float32) and versions; its continuation's generated
    tokens were generated after the checkpoint's, in order: their versions never go down from the checkpoint's
    newest, and the last one is the fill's ``policy_version`` (the upstream's weights may move during a
    continuation -- 6 then 7, posted at 7 -- but no continuation hides a newer policy behind an older tag;
    ``ingest.check_versions`` bounds them above). 422 naming the field otherwise. A checkpoint without
    behaviour log-probs (its member had no behaviour policy) is resumed without any: the fill's ``logprobs``
    is null exactly then, never half (no made-up values for the old tokens)."""
    if t.token_ids is None or t.segments is not None:
        raise BadRequest("trajectory.token_ids: a resumed trajectory carries its token ids (no segments), "
                         "beginning with its checkpoint's")
    old_lp = checkpoint.get("logprobs")
    _check_resume_logprobs(t, old_lp is not None)
    missing = [k for k in ("loss_mask", "versions") if getattr(t, k) is None]
    if missing:
        raise BadRequest(f"trajectory.{missing[0]}: required in a resume fill (a resumed trajectory carries "
                         f"{', '.join(missing)} with its checkpoint's values on the checkpoint's tokens)")
    assert t.loss_mask is not None and t.versions is not None
    prefix = checkpoint.get("token_ids") or []
    k, ids = len(prefix), t.token_ids
    if len(ids) < k or ids[:k] != prefix:
        raise BadRequest(f"trajectory.token_ids: a resumed trajectory begins with its checkpoint's {k} tokens")
    if not any(t.loss_mask[k:]):
        raise BadRequest(f"trajectory.token_ids: a resumed trajectory adds at least one generated token (loss_mask "
                         f"1) after its checkpoint's {k}; a fill that only repeats the checkpoint is no continuation")
    if t.loss_mask[:k] != (checkpoint.get("loss_mask") or []):
        raise BadRequest("trajectory.loss_mask: differs from the checkpoint's loss_mask on its tokens")
    if old_lp is not None and t.logprobs is not None and _f32(t.logprobs[:k]) != _f32(old_lp):
        raise BadRequest("trajectory.logprobs: differs from the checkpoint's behaviour log-probs on its tokens")
    if t.versions[:k] != (checkpoint.get("versions") or []):
        raise BadRequest("trajectory.versions: differs from the checkpoint's versions on its tokens")
    newest, last = max((v for v in t.versions[:k] if v >= 0), default=0), -1
    for i in range(k, len(ids)):
        if not t.loss_mask[i]:
            continue
        if t.versions[i] < newest:
            raise BadRequest(f"trajectory.versions[{i}]: a continuation token is generated after the tokens before "
                             f"it, by a policy no older than their newest version {newest}, got {t.versions[i]}")
        newest, last = t.versions[i], i
    if last >= 0 and t.versions[last] != policy_version:
        raise BadRequest(f"trajectory.versions[{last}]: the continuation's last generated token is the fill's "
                         f"policy_version {policy_version}'s (the policy that posts it generated it), got "
                         f"{t.versions[last]}")


def _check_resume_logprobs(t: TrajectoryIn, checkpoint_has: bool) -> None:
    """Behaviour log-probs in a resume fill exactly when its checkpoint has them (422 ``trajectory.logprobs``)."""
    if checkpoint_has and t.logprobs is None:
        raise BadRequest("trajectory.logprobs: required in a resume fill (a resumed trajectory carries logprobs "
                         "with its checkpoint's values on the checkpoint's tokens)")
    if not checkpoint_has and t.logprobs is not None:
        raise BadRequest("trajectory.logprobs: the checkpoint has no behaviour log-probs, so the resumed "
                         "trajectory has none (null): values for the checkpoint's tokens would be made up")


def _check_trainable(t: TrajectoryIn) -> None:
    """A replacement is there to be trained: it carries token_ids and a loss_mask (or segments) with at least
    one generated token (loss_mask 1). A waiting group is trainable (untrainable ones never reach curation),
    so one without arrays would drop the whole group as untrainable after a 201; and one that generated
    nothing has no prompt to check against its group's (``_check_same_prompt``) -- any sequence, another
    group's answer included, would enter the baseline."""
    if t.segments is None:
        missing = [k for k in ("token_ids", "loss_mask") if getattr(t, k) is None]
        if missing:
            raise BadRequest(f"trajectory.{missing[0]}: required in a replacement (it is trained with its group: "
                             f"token_ids and loss_mask, or segments)")
    masks = [s.loss_mask for s in t.segments] if t.segments is not None else [t.loss_mask or []]
    if not any(any(m[1:]) for m in masks):  # a token trained is predicted from the ones before it
        field = "segments[].loss_mask" if t.segments is not None else "loss_mask"
        raise BadRequest(f"trajectory.{field}: a replacement has at least one generated token to train (loss_mask "
                         "1 after its sequence's first token); one that generated nothing answers nothing")


def _check_not_older(g: Group, idx: int, t: TrajectoryIn, policy_version: int, kept: int) -> None:
    """A replacement is no older than the members of its group that train (422 ``policy_version``): the
    group's staleness is their oldest generated token's (``filters.rules.staleness_version`` over the members
    whose action is keep / penalize), so an older fill -- any producer's, for any
    waiting group -- would make the whole group stale and drop its completers; a producer that ignores the
    request only makes the group wait, and one that answers must not do worse. ``kept``: the tokens a
    resumed fill keeps from its checkpoint (the member's own, already in the group): only what the fill
    adds is judged."""
    trained = [token_versions(x, g.policy_version) for x in g.trajectories
               if x.idx != idx and x.action in TRAINED_ACTIONS]
    group_oldest = staleness_version(trained, g.policy_version)
    if t.segments is not None and policy_version < g.policy_version:
        raise BadRequest(f"policy_version: a segmented replacement carries no per-token versions, so it is "
                         f"posted by its group's policy version {g.policy_version} or a newer one, got "
                         f"{policy_version}")
    added = [policy_version] if t.versions is None else t.versions[kept:]
    mine = staleness_version([added], policy_version)
    if mine < group_oldest:
        raise BadRequest(f"policy_version: the replacement's oldest generated token is policy version {mine}, "
                         f"older than every member of group {g.id!r} that trains (oldest {group_oldest}); it "
                         "would make the whole group stale")


def prompt_tokens(ids: list[int] | None, mask: list[int] | None) -> list[int] | None:
    """The tokens before the first generated one (loss_mask 1): the prompt the model answered; None when
    unknown (no arrays, or nothing generated)."""
    if ids is None or mask is None or 1 not in mask:
        return None
    return ids[: mask.index(1)]


def _check_same_prompt(g: Group, t: TrajectoryIn) -> None:
    """A replacement answers its group's prompt: when every member (the one it replaces included) begins
    with the same prompt tokens, the fill's must be those (422 naming the first differing position): group
    A's answer posted into group B's slot is refused, not trained with B's advantages. Members that differ
    (a producer that varies the prompt per member) say nothing about the group's prompt: no check."""
    shared: list[int] | None = None
    for x in g.trajectories:
        p = prompt_tokens(arrays.decode_list(x.token_ids, arrays.TOKEN_DTYPE),
                          arrays.decode_list(x.loss_mask, arrays.MASK_DTYPE))
        if p is None or (shared is not None and p != shared):
            return  # members that differ (or are unknown) say nothing about the group's prompt
        shared = p
    ids, mask, _ = t.flat_arrays()
    mine = prompt_tokens(ids, mask)
    if shared is None or mine is None or mine == shared:
        return
    at = next((i for i, (a, b) in enumerate(zip(mine, shared, strict=False)) if a != b), min(len(mine), len(shared)))
    field = "segments[0].token_ids" if t.segments is not None else "token_ids"
    raise BadRequest(f"trajectory.{field}[{at}]: the replacement's prompt tokens (before its first loss_mask 1) "
                     f"differ from those every other member of group {g.id!r} begins with ({len(shared)} tokens); "
                     "a replacement answers its group's prompt")


def _check_request(session: Session, g: Group, idx: int, req: SamplingRequest, request_id: int | None) -> None:
    """A fill naming the request it answers (``request_id``) must name this slot's one (409 otherwise): the
    open request, or for the same fill sent again the request it filled."""
    if request_id is None or request_id == req.pk:
        return
    other = session.get(SamplingRequest, request_id)
    where = ""
    if other is not None and other.source_group_pk is not None and other.idx is not None:
        where = " (it asked for another slot)" if other.source_group_pk == g.pk else " (it asked for another group)"
    raise Conflict(f"request_id: request {request_id} is not the request of slot {idx} of group {g.id!r}{where}; "
                   f"that is request {req.pk}", detail={"group_id": g.id, "index": idx, "request_id": req.pk})


def _with_versions(t: TrajectoryIn, policy_version: int) -> TrajectoryIn:
    if t.versions is not None or t.token_ids is None or t.loss_mask is None:
        return t
    return t.model_copy(update={"versions": [policy_version if v else -1 for v in t.loss_mask]})


def _answer(g: Group, idx: int, req: SamplingRequest, open_left: int) -> dict[str, Any]:
    return {"group_id": g.id, "index": idx, "reason": req.reason, "request_id": req.pk,
            "group_status": g.status, "open_slots": open_left}


def fill_slot(session: Session, group_id: str, idx: int, policy_version: int, t: TrajectoryIn, *,
              max_sequence_tokens: int, key: Principal = OPEN, request_id: int | None = None
              ) -> tuple[dict[str, Any], bool]:
    """Store a producer's replacement for slot ``idx`` of a waiting group -> (answer, created?)."""
    g = ingest.lock_group(session, group_id)
    if g is None or not key.allows_dataset(g.dataset):  # out of scope: exactly like an unknown id
        raise NotFound(f"group_id: no group {group_id!r}")
    if idx >= g.n_trajectories:
        raise BadRequest(f"index: group {group_id!r} has trajectories 0 to {g.n_trajectories - 1}, got {idx}")
    ingest.check_trajectory_limits(t, "trajectory.", max_sequence_tokens)
    digest = ingest.trajectory_hash(t, policy_version)
    slots = curate_repo.slot_requests(session, g.pk, idx)
    for req in slots:
        if req.fill_hash == digest:  # the same fill again: its answer, nothing stored twice
            _check_request(session, g, idx, req, request_id)  # ... when it names the request it answered
            return _answer(g, idx, req, curate_repo.count_open_slots(session, g.pk)), False
    waiting = [r for r in slots if r.filled_at is None and r.status != "expired"]
    if g.status != "waiting" or not waiting:
        filled = any(r.filled_at is not None for r in slots)
        why = "was already filled with a different trajectory" if filled else "is not awaiting a replacement"
        raise Conflict(f"index: slot {idx} of group {group_id!r} {why} (group status {g.status!r})",
                       detail={"group_id": group_id, "index": idx, "status": g.status})
    if g.wait_until is not None and g.wait_until <= db_now(session):  # before maintenance expires the slot
        raise Conflict(f"index: the deadline of slot {idx} of group {group_id!r} passed at "
                       f"{g.wait_until.isoformat()}; it is not awaiting a replacement any more",
                       detail={"group_id": group_id, "index": idx, "status": g.status})
    req = waiting[-1]
    _check_request(session, g, idx, req, request_id)
    _check_trainable(t)
    kept = 0
    if req.reason == "resume":  # first: a differing checkpoint part is named as such
        _check_resume(t, req.checkpoint or {}, policy_version)
        kept = len((req.checkpoint or {}).get("token_ids") or ())
    _check_same_prompt(g, t)
    ingest.check_versions(t, policy_version, "trajectory.")
    t = _with_versions(t, policy_version)
    _check_not_older(g, idx, t, policy_version, kept)
    ingest.replace_trajectory(session, g.pk, idx, t)
    now = db_now(session)
    curate_repo.mark_filled(session, req.pk, digest, now)
    log_decisions(session, [{
        "group_pk": g.pk, "idx": idx, "policy_name": g.curation_policy_name,
        "policy_version": g.curation_policy_version, "action": req.reason, "rule": FILLED,
        "reason": f"slot {idx}: {req.reason} filled by {key.name or 'a producer'} (policy version {policy_version}, "
                  f"{t.finish_reason})",
    }])
    n_tokens = sum(t.n_token_ids() if x.idx == idx else x.seq_len for x in g.trajectories)
    open_left = curate_repo.count_open_slots(session, g.pk)
    own = t.versions if t.versions is not None else [policy_version]  # a segmented fill: all its policy's
    versions = [own if x.idx == idx else token_versions(x, g.policy_version) for x in g.trajectories]
    update: dict[str, Any] = {"pk": g.pk, "n_tokens": n_tokens,  # staleness by its oldest token, the fill's too
                              "oldest_version": ingest.oldest_version(versions, g.policy_version)}
    if open_left == 0:
        update |= _rescore_fields()
        g.status = "received"
    ingest.update_groups(session, [update])
    return _answer(g, idx, req, open_left), True


def _rescore_fields() -> dict[str, Any]:
    """A group sent back through scoring (a replacement has no rewards yet)."""
    return {"status": "received", "wait_until": None, "score_attempts": 0, "retry_at": None, "claimed_by": None,
            "claimed_until": None, "score_error": None, "drop_reason": None, "score_deaths": 0,
            "death_tokens": []}


# -- the deadline ------------------------------------------------------------------------------------------
def expire_waits(session: Session, limit: int = 256) -> list[Group]:
    """Groups whose wait ran out train with what they have: unfilled slots expire (one decision each); a
    group some slot of which was filled is scored again (``received``), the others are returned to be
    curated now (status ``scored``)."""
    now = db_now(session)  # wait_until is the database's time (the fill's deadline)
    groups = curate_repo.due_waiting(session, now, limit)
    rescore, curate_now, decisions = [], [], []
    for g in groups:
        for req in curate_repo.expire_slots(session, g.pk):
            decisions.append({
                "group_pk": g.pk, "idx": req.idx, "policy_name": g.curation_policy_name,
                "policy_version": g.curation_policy_version, "action": req.reason, "rule": UNFILLED,
                "reason": f"slot {req.idx}: no {req.reason} replacement before the deadline; "
                          "the group trains without it",
            })
        replaced = any(t.action is None for t in g.trajectories)  # a fill cleared its decision
        (rescore if replaced else curate_now).append(g)
    log_decisions(session, decisions)
    ingest.update_groups(session, [{"pk": g.pk, **_rescore_fields()} for g in rescore])
    ingest.update_groups(session, [{"pk": g.pk, "status": "scored", "wait_until": None} for g in curate_now])
    return curate_now
