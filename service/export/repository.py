"""The export's statements: stored trajectories with their group and prompt, in (group, index) order, read
one keyset page of whole groups at a time (``group_page`` then ``page_rows``), each page in a short
transaction of its own, so memory stays constant in the number of rows and no transaction outlives a page."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Text, func, select
from sqlalchemy.orm import Session

from service.store.models import Group, Prompt, Trajectory
from service.store.queries import rewards_column


def _filtered(stmt: Any, *, dataset: str | None, min_policy_version: int | None, max_policy_version: int | None,
              statuses: list[str]) -> Any:
    stmt = stmt.where(Group.status.in_(statuses))
    if dataset is not None:
        stmt = stmt.where(Group.dataset == dataset)
    if min_policy_version is not None:
        stmt = stmt.where(Group.policy_version >= min_policy_version)
    if max_policy_version is not None:
        stmt = stmt.where(Group.policy_version <= max_policy_version)
    return stmt


def group_bytes(session: Session, pks: list[int]) -> dict[int, int]:
    """About how many bytes each group's rows read: its trajectories' messages and metadata as JSON text, and
    their token arrays (read by the rollouts export)."""
    t = Trajectory.__table__
    # the whole arrays: the stored bytes and, when a member's prompt is stored once for its group, the prefix's
    whole = ((t.c.token_ids, 4), (t.c.loss_mask, 1), (t.c.logprobs, 4))
    arrays = sum((func.coalesce(func.octet_length(c) + t.c.prefix_len * size, 0) for c, size in whole),
                 start=func.octet_length(t.c.metadata.cast(Text)))
    size = func.sum(func.octet_length(t.c.messages.cast(Text)) + arrays)
    stmt = select(t.c.group_pk, size).where(t.c.group_pk.in_(pks)).group_by(t.c.group_pk)
    return {pk: int(n or 0) for pk, n in session.execute(stmt)}


def group_page(session: Session, *, after_pk: int, max_rows: int, dataset: str | None,
               min_policy_version: int | None, max_policy_version: int | None, statuses: list[str],
               max_bytes: int | None = None) -> list[int]:
    """The pks of the next groups after ``after_pk`` (in pk order) that match, as many as fit in ``max_rows``
    trajectories and (with ``max_bytes``) about that many bytes of trajectory JSON (at least one group)."""
    stmt = select(Group.pk, Group.n_trajectories).where(Group.pk > after_pk).order_by(Group.pk).limit(max_rows)
    stmt = _filtered(stmt, dataset=dataset, min_policy_version=min_policy_version,
                     max_policy_version=max_policy_version, statuses=statuses)
    pks, rows = [], 0
    for pk, n in session.execute(stmt):
        if pks and rows + n > max_rows:
            break
        pks.append(pk)
        rows += n
    if max_bytes is None or len(pks) <= 1:
        return pks
    sizes, read = group_bytes(session, pks), 0
    for i, pk in enumerate(pks):
        read += sizes.get(pk, 0)
        if i and read > max_bytes:
            return pks[:i]
    return pks


def page_rows(session: Session, pks: list[int], *, statuses: list[str], with_rewards: bool,
              with_arrays: bool = False, with_reference: bool = False) -> list[dict[str, Any]]:
    """One dict per trajectory of the groups ``pks`` (still in ``statuses``), ordered by group then index;
    ``with_arrays``: the stored token ids / log-probs / loss masks (bytes); ``with_reference``: the prompt's."""
    columns = [
        Group.pk.label("group_pk"), Group.id.label("group_id"), Group.prompt_id, Group.dataset,
        Group.policy_version, Group.status.label("group_status"), Group.reward_spec_name, Group.reward_spec_version,
        Prompt.messages.label("prompt_messages"), Prompt.metadata_.label("prompt_metadata"),
        Trajectory.idx, Trajectory.messages, Trajectory.final_answer, Trajectory.finish_reason,
        Trajectory.num_tokens, Trajectory.num_turns, Trajectory.metadata_.label("metadata"), Trajectory.total_reward,
        Trajectory.outcome, Trajectory.advantage, Trajectory.action, Trajectory.reason,
        Trajectory.segments, Trajectory.segment_advantages,
    ]
    if with_rewards:
        columns.append(rewards_column().label("rewards"))
    if with_arrays:
        columns += [Trajectory.token_ids, Trajectory.logprobs, Trajectory.loss_mask]
    if with_reference:
        columns.append(Prompt.reference.label("prompt_reference"))
    stmt = (
        select(*columns)
        .join(Trajectory, Trajectory.group_pk == Group.pk)
        .join(Prompt, Prompt.id == Group.prompt_id)
        .where(Group.pk.in_(pks), Group.status.in_(statuses))
        .order_by(Group.pk, Trajectory.idx)
    )
    return [dict(row) for row in session.execute(stmt).mappings()]
