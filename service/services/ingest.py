"""Ingest: prompts and rollout groups, idempotent by the client-supplied group id."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from pydantic import TypeAdapter
from sqlalchemy.orm import Session

from reward_models.spec import RewardSpec
from service import arrays
from service.errors import BadRequest, GroupConflict
from service.repositories import groups as group_repo
from service.repositories import prompts as prompt_repo
from service.schemas import GroupAck, GroupIn, Message, PromptIn, PromptUpsert, TrajectoryIn
from service.services import specs


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


def upsert_prompts(session: Session, prompts: list[PromptUpsert]) -> int:
    seen: dict[str, PromptUpsert] = {}
    for i, p in enumerate(prompts):
        if p.id in seen:
            raise BadRequest(f"prompts[{i}].id: duplicate id {p.id!r} in one request")
        seen[p.id] = p
    check_reference(session, [(f"prompts[{i}].", p) for i, p in enumerate(prompts)])
    return prompt_repo.upsert_prompts(session, [_prompt_row(p.id, p) for p in prompts])


_MESSAGES = TypeAdapter(list[Message])


def _trajectory_row(group_pk: int, idx: int, t: TrajectoryIn) -> tuple[Any, ...]:
    """One row in group_repo.TRAJECTORY_COLUMNS order (JSONB as JSON text)."""
    return (
        group_pk,
        idx,
        _MESSAGES.dump_json(t.messages, exclude_none=True).decode(),
        t.resolved_final_answer(),
        arrays.encode(t.token_ids, arrays.TOKEN_DTYPE),
        arrays.encode(t.loss_mask, arrays.MASK_DTYPE),
        arrays.encode(t.logprobs, arrays.LOGPROB_DTYPE),
        len(t.token_ids) if t.token_ids is not None else 0,
        t.response_tokens(),
        sum(1 for m in t.messages if m.role == "assistant") or 1,
        t.finish_reason,
        orjson.dumps(t.metadata).decode(),
    )


def body_hash(group: GroupIn) -> str:
    return hashlib.sha256(group.model_dump_json().encode()).hexdigest()


def _check_limits(group: GroupIn, where: str, max_group_size: int, max_sequence_tokens: int) -> None:
    if len(group.trajectories) > max_group_size:
        raise BadRequest(
            f"{where}trajectories: {len(group.trajectories)} trajectories exceed the limit of {max_group_size}"
        )
    for i, t in enumerate(group.trajectories):
        if t.token_ids is not None and len(t.token_ids) > max_sequence_tokens:
            raise BadRequest(
                f"{where}trajectories[{i}].token_ids: {len(t.token_ids)} tokens exceed the limit of {max_sequence_tokens}"
            )


def ingest_groups(
    session: Session,
    groups: list[GroupIn],
    *,
    max_group_size: int,
    max_sequence_tokens: int,
    batched: bool,
    max_groups: int | None = None,
) -> list[GroupAck]:
    """Store each group once. Same id + same body: the stored answer; same id + other body: 409.

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
    check_reference(
        session,
        [(f"groups[{i}].prompt." if batched else "prompt.", g.prompt) for i, g in enumerate(groups) if g.prompt is not None],
    )
    inline = {g.prompt_id: g.prompt for g in groups if g.prompt is not None}
    if inline:
        prompt_repo.upsert_prompts(session, [_prompt_row(pid, p) for pid, p in inline.items()])
    datasets = prompt_repo.prompt_datasets(session, {g.prompt_id for g in groups})
    acks = []
    for i, g in enumerate(groups):
        where = f"groups[{i}]." if batched else ""
        if g.prompt_id not in datasets:
            raise BadRequest(
                f"{where}prompt_id: unknown prompt {g.prompt_id!r}; post it to /v1/prompts first or send 'prompt' inline",
                status_code=422,
            )
        acks.append(_ingest_one(session, g, datasets[g.prompt_id], where))
    return acks


def _ingest_one(session: Session, g: GroupIn, dataset: str, where: str) -> GroupAck:
    digest = body_hash(g)
    row = {
        "id": g.id,
        "prompt_id": g.prompt_id,
        "dataset": dataset,
        "policy_version": g.policy_version,
        "sampling": g.sampling,
        "metadata": g.metadata,
        "body_hash": digest,
        "n_trajectories": len(g.trajectories),
        "n_tokens": sum(len(t.token_ids or ()) for t in g.trajectories),
    }
    pk = group_repo.insert_group_if_new(session, row)
    if pk is None:
        existing = group_repo.existing_group(session, g.id)
        if existing is None or existing.body_hash != digest:
            raise GroupConflict(
                f"{where}id: group {g.id!r} already exists with a different body", detail={"id": g.id}
            )
        return GroupAck(id=g.id, status=existing.status, trajectories=existing.n_trajectories, created=False)
    group_repo.insert_trajectories(session, [_trajectory_row(pk, i, t) for i, t in enumerate(g.trajectories)])
    return GroupAck(id=g.id, status="received", trajectories=len(g.trajectories), created=True)
