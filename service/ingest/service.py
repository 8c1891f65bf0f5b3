"""Ingest: prompts and rollout groups, idempotent by the client-supplied group id."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson
from pydantic import TypeAdapter
from sqlalchemy.orm import Session

from filters.rules import staleness_version
from reward_models.spec import RewardSpec
from service.api.errors import BadRequest, Conflict, GroupConflict
from service.api.schemas import Message
from service.auth.service import OPEN, Principal
from service.ingest import prompts_repository as prompt_repo
from service.ingest import repository as group_repo
from service.ingest.schemas import GroupAck, GroupIn, PromptIn, PromptUpsert, TrajectoryIn
from service.specs import service as specs
from service.store import arrays


def _prompt_row(prompt_id: str, p: PromptIn) -> dict[str, Any]:
    return {
        "id": prompt_id,
        "dataset": p.dataset,
        "messages": [m.model_dump(exclude_none=True) for m in p.messages],
        "reference": p.reference,
        "metadata": p.metadata,
        "reward_spec": p.reward_spec,
        "curation_policy": p.curation_policy,
    }


def check_reference(session: Session, prompts: list[tuple[str, PromptIn]]) -> None:
    """Each prompt's ``reference`` holds what its reward spec's components need, as each component
    checks it (``where`` prefixes the field)."""
    resolved: dict[tuple[str | None, str], tuple[str, RewardSpec | None]] = {}
    for where, p in prompts:
        key = (p.reward_spec, p.dataset)
        if key not in resolved:
            resolved[key] = specs.scoring_spec(session, *key)
        spec_name, spec = resolved[key]
        problem = spec.reference_problem(p.reference) if spec is not None else None
        if problem is not None:
            field, message, component = problem
            raise BadRequest(
                f"{where}reference.{field}: {message}; needed by reward spec {spec_name!r} (component "
                f"{component!r}): add it, or attach a spec that does not need it"
            )


def check_reference_source(
    session: Session, prompts: list[tuple[str, PromptIn]], key: Principal, caller_specs: frozenset[str]
) -> None:
    """A non-admin key's inline prompt may not carry a reference its spec runs as code (403 naming the field;
    see ``service.specs.references``)."""
    if key.is_admin:
        return
    for where, p in prompts:
        spec_name, spec = specs.scoring_spec(session, p.reward_spec, p.dataset)
        specs.check_caller_references(spec_name, spec, key, [(f"{where}reference", p.reference)], caller_specs)


def check_refs(session: Session, p: PromptIn, where: str) -> None:
    """A prompt naming a reward spec or curation policy that does not exist is refused at the door (422
    naming the field); otherwise every group of it would fail in the worker."""
    if p.reward_spec is not None:
        specs.resolve_reward_spec(session, p.reward_spec, f"{where}reward_spec")
    if p.curation_policy is not None:
        specs.resolve_curation_policy(session, p.curation_policy, f"{where}curation_policy")


def upsert_prompts(session: Session, prompts: list[PromptUpsert]) -> int:
    seen: dict[str, PromptUpsert] = {}
    for i, p in enumerate(prompts):
        if p.id in seen:
            raise BadRequest(f"prompts[{i}].id: duplicate id {p.id!r} in one request")
        seen[p.id] = p
        check_refs(session, p, f"prompts[{i}].")
    check_reference(session, [(f"prompts[{i}].", p) for i, p in enumerate(prompts)])
    # POST /v1/prompts is an admin's (and import-prompts an operator's): the references are admin-loaded
    return prompt_repo.upsert_prompts(session, [{**_prompt_row(p.id, p), "reference_from_admin": True}
                                                for p in prompts])


_MESSAGES = TypeAdapter(list[Message])


def _trajectory_row(group_pk: int, idx: int, t: TrajectoryIn) -> tuple[Any, ...]:
    """One row in group_repo.TRAJECTORY_COLUMNS order (JSONB as JSON text). A segmented trajectory stores
    its segments' arrays concatenated in order, and their lengths (and messages) in ``segments``."""
    token_ids, loss_mask, logprobs = t.flat_arrays()
    segments = None
    if t.segments is not None:
        segments = orjson.dumps([
            {"length": len(s.token_ids),
             "messages": None if s.messages is None else orjson.loads(_MESSAGES.dump_json(s.messages, exclude_none=True))}
            for s in t.segments
        ]).decode()
    return (
        group_pk,
        idx,
        _MESSAGES.dump_json(t.messages, exclude_none=True).decode(),
        t.resolved_final_answer(),
        arrays.encode(token_ids, arrays.TOKEN_DTYPE),
        arrays.encode(loss_mask, arrays.MASK_DTYPE),
        arrays.encode(logprobs, arrays.LOGPROB_DTYPE),
        t.n_token_ids(),
        t.response_tokens(),
        sum(1 for m in t.messages if m.role == "assistant") or 1,
        t.finish_reason,
        orjson.dumps(t.metadata).decode(),
        segments,
        arrays.encode(t.versions, arrays.VERSION_DTYPE),
        0,  # prefix_len: whole (new groups' rows lose their shared prefix in group_repo.insert_new_groups_trajectories)
    )


_ARRAYS = frozenset({"token_ids", "loss_mask", "logprobs", "versions"})


def _canonical(value: Any) -> Any:
    """Plain data in one spelling: dict keys sorted, integral floats as ints (1.0 == 1), -0.0 as 0."""
    if isinstance(value, dict):
        return {str(k): _canonical(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _canonical_trajectory(t: dict[str, Any]) -> dict[str, Any]:
    out = {k: v if k in _ARRAYS else _canonical(v) for k, v in t.items() if k != "segments"}
    if t.get("segments") is not None:  # absent when None: an unsegmented group hashes as before
        out["segments"] = [{k: v if k in _ARRAYS else _canonical(v) for k, v in s.items()} for s in t["segments"]]
    return out


# model_dump leaves the token arrays out (pydantic copies every element: 70% of the hash's time); they are put
# back as the model holds them -- the same lists of ints and floats the dump would give, so the same hash
_SEGMENT_ARRAYS = ("token_ids", "loss_mask", "logprobs")
_DUMP_WITHOUT_ARRAYS = {"trajectories": {"__all__": {**dict.fromkeys(_ARRAYS, True),
                                                     "segments": {"__all__": set(_SEGMENT_ARRAYS)}}}}


def body_hash(group: GroupIn) -> str:
    """The idempotency hash of a group: the same content hashes the same, whatever the key order of
    free-form objects (``sampling``, ``metadata``, ``reference``) or the spelling of a number."""
    dump = group.model_dump(mode="json", exclude=_DUMP_WITHOUT_ARRAYS)
    canonical = {k: _canonical(v) for k, v in dump.items() if k != "trajectories"}
    # token arrays are typed (ints, floats): only the trajectories' free-form parts need the walk
    canonical["trajectories"] = [
        _canonical_trajectory(_with_arrays(d, t)) for d, t in zip(dump["trajectories"], group.trajectories, strict=True)
    ]
    # an Arrow body's arrays are numpy (int32 / uint8 / float64): orjson writes them as the same numbers' lists
    return hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)).hexdigest()


def _with_arrays(dump: dict[str, Any], t: TrajectoryIn) -> dict[str, Any]:
    """A trajectory's dump without its arrays -> with them (and its segments'), as ``model_dump`` gives them."""
    for name in _ARRAYS:
        dump[name] = getattr(t, name)
    if t.segments is not None:
        for d, s in zip(dump["segments"], t.segments, strict=True):
            for name in _SEGMENT_ARRAYS:
                d[name] = getattr(s, name)
    return dump


def _check_limits(group: GroupIn, where: str, max_group_size: int, max_sequence_tokens: int) -> None:
    if len(group.trajectories) > max_group_size:
        raise BadRequest(
            f"{where}trajectories: {len(group.trajectories)} trajectories exceed the limit of {max_group_size}"
        )
    for i, t in enumerate(group.trajectories):
        check_trajectory_limits(t, f"{where}trajectories[{i}].", max_sequence_tokens)
        check_versions(t, group.policy_version, f"{where}trajectories[{i}].")


def _inline_prompts(session: Session, groups: list[GroupIn], batched: bool, key: Principal) -> None:
    """Create the inline prompts that are new; an inline prompt that differs from the stored one is a 409
    naming the field (changing a prompt or its reference is ``POST /v1/prompts``, an admin's call). A stored
    prompt outside ``key``'s datasets is a 409 that says only that the id is taken: no field-by-field
    answer that would let a scoped key test guesses of another dataset's reference."""
    sent: dict[str, tuple[str, dict[str, Any]]] = {}
    for i, g in enumerate(groups):
        if g.prompt is None:
            continue
        row = _prompt_row(g.prompt_id, g.prompt)
        if g.prompt_id in sent and sent[g.prompt_id][1] != row:
            raise BadRequest(f"groups[{i}].prompt: differs from {sent[g.prompt_id][0]}prompt for the same prompt_id")
        sent.setdefault(g.prompt_id, (f"groups[{i}]." if batched else "", row))
    if not sent:
        return
    # provenance (service.specs.references): an inline prompt's reference is admin-loaded only from an admin key
    prompt_repo.insert_prompts_if_new(session, [{**row, "reference_from_admin": key.is_admin}
                                                for _, row in sent.values()])
    stored = prompt_repo.stored_fields(session, sent)
    for prompt_id, (where, row) in sent.items():
        if not key.allows_dataset(stored[prompt_id]["dataset"]):
            raise Conflict(f"{where}prompt_id: prompt id {prompt_id!r} is already taken", detail={"prompt_id": prompt_id})
        for field, value in stored[prompt_id].items():
            if row[field] != value:
                raise Conflict(
                    f"{where}prompt.{field}: prompt {prompt_id!r} already exists with a different {field}; "
                    "an inline prompt only creates a prompt (an admin changes one with POST /v1/prompts)",
                    detail={"prompt_id": prompt_id, "field": field},
                )


def ingest_groups(
    session: Session,
    groups: list[GroupIn],
    *,
    max_group_size: int,
    max_sequence_tokens: int,
    batched: bool,
    max_groups: int | None = None,
    key: Principal = OPEN,
    caller_specs: frozenset[str] = frozenset(),
) -> list[GroupAck]:
    """Store each group once. Same id + same body: the stored answer; same id + other body: 409.
    Each group's dataset must be in ``key``'s scope (403); the key's name is recorded as the producer. A
    non-admin key's inline prompt carries no reference its spec runs as code, unless the spec is in
    ``caller_specs`` (403).

    The caller's transaction makes the request all-or-nothing.
    """
    if max_groups is not None and len(groups) > max_groups:
        raise BadRequest(f"groups: {len(groups)} groups exceed the limit of {max_groups} per request")
    seen: set[str] = set()
    for i, g in enumerate(groups):
        where = f"groups[{i}]." if batched else ""
        if g.id in seen:
            raise BadRequest(f"{where}id: duplicate group id {g.id!r} in one request")
        seen.add(g.id)
        _check_limits(g, where, max_group_size, max_sequence_tokens)
        if g.prompt is not None:  # before anything is written: a new prompt's dataset must be in scope
            key.check_dataset(g.prompt.dataset, f"{where}prompt.dataset")
    for i, g in enumerate(groups):
        if g.prompt is not None:
            check_refs(session, g.prompt, f"groups[{i}].prompt." if batched else "prompt.")
    inline = [(f"groups[{i}].prompt." if batched else "prompt.", g.prompt)
              for i, g in enumerate(groups) if g.prompt is not None]
    check_reference_source(session, inline, key, caller_specs)
    check_reference(session, inline)
    _inline_prompts(session, groups, batched, key)
    datasets = prompt_repo.lock_prompts_for_groups(session, {g.prompt_id for g in groups})  # one lock order
    # out of the key's scope: the same answer as an unknown id (no dataset named, no existence told); the groups
    # before the first such one are stored (or answer their 409) first, as when each group went in on its own
    unknown = next((i for i, g in enumerate(groups)
                    if g.prompt_id not in datasets or not key.allows_dataset(datasets[g.prompt_id])), None)
    known = groups if unknown is None else groups[:unknown]
    acks = _ingest_all(session, known, [datasets[g.prompt_id] for g in known], batched, key.name)
    if unknown is not None:
        where = f"groups[{unknown}]." if batched else ""
        raise BadRequest(
            f"{where}prompt_id: unknown prompt {groups[unknown].prompt_id!r}; post it to /v1/prompts first or send "
            "'prompt' inline",
            status_code=422,
        )
    return acks


def oldest_version(versions: Iterable[Iterable[int] | None], policy_version: int) -> int | None:
    """The ``groups.oldest_version`` of a group posted at ``policy_version`` whose trajectories carry these
    per-token ``versions`` (None: every generated token is the group's): the oldest version >= 0 when it is
    older than ``policy_version``, else None. The one rule for a post and a slot fill."""
    oldest = staleness_version(versions, policy_version)
    return oldest if oldest < policy_version else None


def _ingest_all(
    session: Session, groups: list[GroupIn], datasets: list[str], batched: bool, producer_key: str | None
) -> list[GroupAck]:
    """Store the groups (their prompts known and in scope) in request order, with a fixed number of statements
    whatever their number: one INSERT of the group rows, one read of the groups already there and one of the
    tombstones, one INSERT of the shared prefixes and one COPY of the members. Each group is answered as before: new
    (201), or already stored / archived with the same body (200), or a 409 -- the first in request order."""
    if not groups:
        return []
    digests = [body_hash(g) for g in groups]
    rows = [
        {
            "id": g.id,
            "prompt_id": g.prompt_id,
            "dataset": dataset,
            "policy_version": g.policy_version,
            "oldest_version": oldest_version((t.versions for t in g.trajectories), g.policy_version),
            "sampling": g.sampling,
            "metadata": g.metadata,
            "body_hash": digest,
            "producer_key": producer_key,
            "n_trajectories": len(g.trajectories),
            "n_tokens": sum(t.n_token_ids() for t in g.trajectories),  # all segments: lease budgets count them
        }
        for g, dataset, digest in zip(groups, datasets, digests, strict=True)
    ]
    ids = [g.id for g in groups]
    new_pks = group_repo.insert_groups_if_new(session, rows)
    existing = group_repo.existing_groups(session, [i for i in ids if i not in new_pks])
    # read after the groups (as one group at a time did): an id that went to the archive before, or while its
    # insert waited for the archiver's commit, or between that insert and the read of the existing rows
    archived = group_repo.tombstones(session, ids)
    acks: list[GroupAck] = []
    stored: list[tuple[int, list[tuple[Any, ...]]]] = []
    for i, (g, digest) in enumerate(zip(groups, digests, strict=True)):
        where = f"groups[{i}]." if batched else ""
        if g.id in new_pks and g.id not in archived:
            pk = new_pks[g.id]
            stored.append((pk, [_trajectory_row(pk, j, t) for j, t in enumerate(g.trajectories)]))
            acks.append(GroupAck(id=g.id, status="received", trajectories=len(g.trajectories), created=True))
            continue
        row = existing.get(g.id)
        if row is None and g.id in archived:  # the archive keeps it: a new row goes, the tombstone answers
            acks.append(_archived_ack(archived[g.id], digest, where))
        elif row is None or row.body_hash != digest:
            raise GroupConflict(f"{where}id: group {g.id!r} already exists with a different body", detail={"id": g.id})
        else:
            acks.append(GroupAck(id=g.id, status=row.status, trajectories=row.n_trajectories, created=False))
    group_repo.delete_groups(session, [new_pks[i] for i in ids if i in new_pks and i in archived])
    group_repo.insert_new_groups_trajectories(session, stored)
    return acks


def _archived_ack(tomb: Any, digest: str, where: str) -> GroupAck:
    """A re-post of an archived group's id: the same body is answered as stored, another is a 409."""
    if tomb.body_hash != digest:
        raise GroupConflict(f"{where}id: group {tomb.id!r} already exists (archived) with a different body",
                            detail={"id": tomb.id})
    return GroupAck(id=tomb.id, status="archived", trajectories=tomb.n_trajectories, created=False)


def prompts_by_id(session: Session, ids: set[str]) -> dict[str, Any]:
    """The stored prompts (ORM rows) with these ids, by id: for the score and curate stages."""
    return group_repo.prompts_by_id(session, ids)


def update_groups(session: Session, rows: list[dict[str, Any]]) -> None:
    """Bulk update of groups by primary key (each row: ``pk`` plus the columns to set, the same keys)."""
    group_repo.update_groups(session, rows)


def lock_group(session: Session, group_id: str) -> Any:
    """The group (ORM row with its trajectories) locked for an in-place change, or None."""
    return group_repo.lock_group(session, group_id)


def check_trajectory_limits(t: TrajectoryIn, where: str, max_sequence_tokens: int) -> None:
    """Every sequence of ``t`` (its tokens, or each of its segments) within ``max_sequence_tokens``."""
    if t.token_ids is not None and len(t.token_ids) > max_sequence_tokens:
        raise BadRequest(
            f"{where}token_ids: {len(t.token_ids)} tokens exceed the limit of {max_sequence_tokens}"
        )
    for j, s in enumerate(t.segments or ()):  # each segment is a sequence of its own
        if len(s.token_ids) > max_sequence_tokens:
            raise BadRequest(
                f"{where}segments[{j}].token_ids: {len(s.token_ids)} tokens exceed the limit of {max_sequence_tokens}"
            )


def check_versions(t: TrajectoryIn, policy_version: int, where: str) -> None:
    """The per-token ``versions`` rule (docs/curation.md, "Resume"), one check for POST /v1/groups and a slot
    fill: a token's version is -1 exactly where the model did not generate it (loss_mask 0), otherwise a
    version in [0, ``policy_version``] (no token is newer than the policy that posts it); 422 naming the
    first offending position."""
    if t.versions is None:
        return
    versions, mask = t.versions, t.loss_mask
    if isinstance(versions, np.ndarray):  # an Arrow body's: the same rule over the whole array, then the walk
        generated = None if mask is None else np.asarray(mask) == 1  # names the first offence, if there is one
        if versions.max(initial=-1) <= policy_version and (generated is None or bool(
                np.all(np.where(generated, versions >= 0, versions == -1)))):
            return
        versions, mask = versions.tolist(), None if mask is None else np.asarray(mask).tolist()
    for i, v in enumerate(versions):
        if v > policy_version:
            raise BadRequest(f"{where}versions[{i}]: version {v} is newer than the policy_version {policy_version}"
                             " that posts it")
        if mask is None:
            continue
        if mask[i] == 1 and v < 0:
            raise BadRequest(f"{where}versions[{i}]: a generated token (loss_mask 1) carries the version that "
                             "generated it, not -1")
        if mask[i] == 0 and v != -1:
            raise BadRequest(f"{where}versions[{i}]: a token the model did not generate (loss_mask 0) has "
                             f"version -1, got {v}")


def replace_trajectory(session: Session, group_pk: int, idx: int, t: TrajectoryIn) -> None:
    """Store ``t`` in place of trajectory ``idx`` of the group (a remedy's replacement); its old rewards,
    scores and decision are gone, so the group is scored and curated again with it."""
    group_repo.replace_trajectory(session, _trajectory_row(group_pk, idx, t))


def trajectory_hash(t: TrajectoryIn, policy_version: int) -> str:
    """The idempotency hash of one posted trajectory (a slot fill), spelled like ``body_hash``."""
    dump = t.model_dump(mode="json")
    canonical = {k: v if k in _ARRAYS else _canonical(v) for k, v in dump.items()}
    canonical["policy_version"] = policy_version
    return hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest()
