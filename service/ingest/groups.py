"""Reading groups back: one group with every score and decision, or a filtered page of summaries."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy.orm import Session

from service.api.errors import BadRequest, NotFound
from service.api.schemas import INT8_MAX
from service.archive import service as archive
from service.auth.service import OPEN, Principal
from service.ingest import prompts_repository as prompt_repo
from service.ingest import repository as group_repo
from service.ingest.schemas import (
    ArchiveOut,
    ComponentOut,
    DecisionOut,
    GroupOut,
    GroupPage,
    GroupSummary,
    SegmentOut,
    TrajectoryOut,
)
from service.store import arrays
from service.store.models import Group, Reward, Trajectory


def _versioned(name: str | None, version: int | None) -> str | None:
    return None if name is None else f"{name}@{version}"


def _trajectory_out(t: Trajectory, rewards: list[Reward], include_tokens: bool) -> TrajectoryOut:
    out = TrajectoryOut(
        index=t.idx,
        finish_reason=t.finish_reason,
        final_answer=t.final_answer,
        num_tokens=t.num_tokens,
        num_turns=t.num_turns,
        messages=t.messages,
        rewards={
            r.component: ComponentOut(value=r.value, error=r.error, details=r.details, latency_ms=r.latency_ms)
            for r in rewards
        },
        total_reward=t.total_reward,
        outcome=t.outcome,
        advantage=t.advantage,
        action=t.action,
        reason=t.reason,
        metadata=t.metadata_,
    )
    bounds = arrays.segment_bounds(t.segments)
    if bounds is not None:
        out.segments = _segments_out(t, bounds, include_tokens)
    elif include_tokens:
        out.token_ids = arrays.decode_list(t.token_ids, arrays.TOKEN_DTYPE)
        out.loss_mask = arrays.decode_list(t.loss_mask, arrays.MASK_DTYPE)
        out.logprobs = arrays.decode_list(t.logprobs, arrays.LOGPROB_DTYPE)
        out.versions = arrays.decode_list(t.versions, arrays.VERSION_DTYPE)
    return out


def _segments_out(t: Trajectory, bounds: list[tuple[int, int]], include_tokens: bool) -> list[SegmentOut]:
    """A segmented trajectory's segments in order, each with its advantage (None until curated)."""
    advs = t.segment_advantages or [None] * len(bounds)
    out = []
    for k, ((start, end), seg) in enumerate(zip(bounds, t.segments or (), strict=True)):
        s = SegmentOut(segment_index=k, is_last=k == len(bounds) - 1, seq_len=end - start,
                       messages=seg.get("messages"), advantage=advs[k])
        if include_tokens:
            s.token_ids = arrays.decode_list(arrays.cut(t.token_ids, arrays.TOKEN_DTYPE, start, end), arrays.TOKEN_DTYPE)
            s.loss_mask = arrays.decode_list(arrays.cut(t.loss_mask, arrays.MASK_DTYPE, start, end), arrays.MASK_DTYPE)
            s.logprobs = arrays.decode_list(arrays.cut(t.logprobs, arrays.LOGPROB_DTYPE, start, end), arrays.LOGPROB_DTYPE)
        out.append(s)
    return out


def get_group(
    session: Session,
    group_id: str,
    *,
    include_tokens: bool = False,
    spec_version: int | None = None,
    key: Principal = OPEN,
) -> GroupOut:
    g = group_repo.load_group(session, group_id)
    if g is None and (tomb := archive.tombstone(session, group_id)) is not None and key.allows_dataset(tomb[0].dataset):
        return _archived_out(session, tomb[0], tomb[1])
    if g is None or not key.allows_dataset(g.dataset):  # out of scope: exactly like an unknown id
        raise NotFound(f"id: no group {group_id!r}")
    by_idx: dict[int, list[Reward]] = defaultdict(list)
    version = spec_version if spec_version is not None else g.reward_spec_version
    if g.reward_spec_name is not None and version is not None:
        for r in group_repo.rewards_for(session, g.pk, g.reward_spec_name, version):
            by_idx[r.idx].append(r)
    decisions = [
        DecisionOut(
            index=d.idx,
            action=d.action,
            rule=d.rule,
            reason=d.reason,
            policy=_versioned(d.policy_name, d.policy_version),
            created_at=d.created_at.isoformat(),
        )
        for d in group_repo.decisions_for(session, g.pk)
    ]
    return GroupOut(
        id=g.id,
        prompt_id=g.prompt_id,
        dataset=g.dataset,
        policy_version=g.policy_version,
        status=g.status,
        drop_reason=g.drop_reason,
        sampling=g.sampling,
        metadata=g.metadata_,
        reward_spec=_versioned(g.reward_spec_name, version),
        curation_policy=_versioned(g.curation_policy_name, g.curation_policy_version),
        score_error=g.score_error,
        created_at=g.created_at.isoformat(),
        lease_id=g.lease_id,
        staleness=g.staleness,
        trajectories=[_trajectory_out(t, by_idx[t.idx], include_tokens) for t in g.trajectories],
        decisions=decisions,
        prompt_messages=_prompt_messages(session, g.prompt_id),
    )


def _archived_out(session: Session, t: Any, location: str) -> GroupOut:
    """An archived group: what its tombstone keeps, and where the rest is."""
    return GroupOut(
        id=t.id, prompt_id=t.prompt_id, dataset=t.dataset, policy_version=t.policy_version, status="archived",
        drop_reason=t.drop_reason, sampling={}, metadata={}, reward_spec=None, curation_policy=None,
        score_error=None, created_at=t.group_created_at.isoformat(), trajectories=[],
        prompt_messages=_prompt_messages(session, t.prompt_id),
        archive=ArchiveOut(location=location, archived_at=t.archived_at.isoformat(), final_status=t.status,
                           n_trajectories=t.n_trajectories),
    )


def _prompt_messages(session: Session, prompt_id: str) -> list[dict[str, Any]] | None:
    prompt = prompt_repo.get_prompt(session, prompt_id)
    return None if prompt is None else prompt.messages


def _summary(g: Group, mean_reward: float | None = None) -> GroupSummary:
    return GroupSummary(
        id=g.id,
        prompt_id=g.prompt_id,
        dataset=g.dataset,
        policy_version=g.policy_version,
        status=g.status,
        drop_reason=g.drop_reason,
        n_trajectories=g.n_trajectories,
        n_tokens=g.n_tokens,
        created_at=g.created_at.isoformat(),
        mean_reward=mean_reward,
    )


def _cursor_pk(cursor: str) -> int:
    """A cursor is the decimal pk of the last group of a page: ASCII digits, at most 2^63 - 1."""
    if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 19 and int(cursor) <= INT8_MAX):
        raise BadRequest("query.cursor: not a cursor returned by this endpoint (ASCII digits up to 2^63 - 1)")
    return int(cursor)


def list_groups(
    session: Session,
    *,
    dataset: str | None,
    status: str | None,
    policy_version: int | None,
    cursor: str | None,
    limit: int,
    **member_filters: Any,
) -> GroupPage:
    """``member_filters``: drop_reason, finish_reason, min_reward, max_reward (see the repository)."""
    after_pk = None
    if cursor is not None:
        after_pk = _cursor_pk(cursor)
    rows = group_repo.list_groups(
        session, dataset=dataset, status=status, policy_version=policy_version, after_pk=after_pk, limit=limit,
        **member_filters,
    )
    next_cursor = str(rows[-1].pk) if len(rows) == limit else None
    means = group_repo.mean_rewards(session, [g.pk for g in rows])
    return GroupPage(groups=[_summary(g, means.get(g.pk)) for g in rows], next_cursor=next_cursor)
