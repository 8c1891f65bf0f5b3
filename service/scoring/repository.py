"""Statements of scoring: the score stage's loads and bulk writes (rewards, trajectory scores), and the
statements that send stored groups back through scoring or curation (rescore / recurate)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Text, any_, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, selectinload

from service.store.models import Group, Prompt, Reward, Trajectory
from service.store.queries import array_param

_CLEARED_TRAJECTORY = {"advantage": None, "action": None, "reason": None}


def _filtered(stmt: Any, *, statuses: tuple[str, ...], dataset: str | None, group_ids: list[str] | None,
              policy_version: int | None) -> Any:
    stmt = stmt.where(Group.status.in_(statuses))
    if dataset is not None:
        stmt = stmt.where(Group.dataset == dataset)
    if group_ids is not None:
        stmt = stmt.where(Group.id == any_(array_param("group_ids", group_ids, Text)))
    if policy_version is not None:
        stmt = stmt.where(Group.policy_version == policy_version)
    return stmt


MAX_GROUPS_PER_CALL = 10_000


def non_admin_code_references(session: Session, fields: tuple[str, ...], limit: int = 5,
                              **filters: Any) -> tuple[int, list[str]]:
    """Matching groups whose prompt's reference carries one of ``fields`` and was not written by an admin
    key -> (how many groups, up to ``limit`` of their prompt ids)."""
    stmt = _filtered(select(Group.prompt_id).join(Prompt, Prompt.id == Group.prompt_id), **filters).where(
        Prompt.reference_from_admin.is_(False),
        Prompt.reference.op("?|")(array_param("code_fields", list(fields), Text)),
    )
    ids = list(session.execute(stmt.order_by(Group.prompt_id)).scalars())
    return len(ids), sorted(set(ids))[:limit]


def lock_matching(session: Session, limit: int = MAX_GROUPS_PER_CALL, **filters: Any) -> list[int]:
    """Lock up to ``limit`` matching groups, in pk order, skipping any a worker or lease holds right now
    (never waiting on them, and never more rows than one call can handle) -> their pks."""
    stmt = _filtered(select(Group.pk), **filters).order_by(Group.pk).limit(limit)
    return list(session.execute(stmt.with_for_update(skip_locked=True)).scalars())


def curated_groups(session: Session, pks: list[int]) -> list[tuple[int, str, float | None, str | None]]:
    """(pk, prompt_id, outcome_mean, drop_reason) of the curated groups among ``pks``, in pk order."""
    if not pks:
        return []
    stmt = (select(Group.pk, Group.prompt_id, Group.outcome_mean, Group.drop_reason)
            .where(Group.pk == any_(array_param("pks", pks, BigInteger)), Group.curated_at.is_not(None))
            .order_by(Group.pk))
    return [(pk, pid, None if m is None else float(m), drop) for pk, pid, m, drop in session.execute(stmt)]


def requeue(session: Session, pks: list[int], values: dict[str, Any], clear_scores: bool) -> None:
    """Set ``values`` on the groups; reset their trajectories' decisions (and scores)."""
    if pks:
        session.execute(update(Group).where(Group.pk == any_(array_param("pks", pks, BigInteger))).values(**values))
        cleared = {**_CLEARED_TRAJECTORY, **({"total_reward": None, "outcome": None} if clear_scores else {})}
        in_groups = Trajectory.group_pk == any_(array_param("pks", pks, BigInteger))
        session.execute(update(Trajectory).where(in_groups).values(**cleared))


def load_groups(session: Session, pks: list[int]) -> list[Group]:
    """Groups (with trajectories) by pk, in pk order, without locks."""
    stmt = select(Group).where(Group.pk.in_(pks)).order_by(Group.pk).options(selectinload(Group.trajectories))
    return list(session.execute(stmt).scalars())


def lock_claimed(session: Session, pks: list[int], token: str) -> set[int]:
    """Of ``pks``, the groups still claimed by ``token`` and still 'received', locked for the write. A claim
    that expired and was taken by another worker has another token: its late results are refused."""
    stmt = (
        select(Group.pk)
        .where(Group.pk.in_(pks), Group.claimed_by == token, Group.status == "received")
        .order_by(Group.pk)
        .with_for_update()
    )
    return set(session.execute(stmt).scalars())


_UPSERT_REWARD = insert(Reward.__table__)
_UPSERT_REWARD = _UPSERT_REWARD.on_conflict_do_update(
    constraint="uq_rewards_key",
    set_={c: _UPSERT_REWARD.excluded[c] for c in ("kind", "value", "details", "error", "latency_ms", "created_at")},
)


def upsert_rewards(session: Session, rows: list[dict[str, Any]]) -> None:
    if rows:
        session.execute(_UPSERT_REWARD, rows)


def update_trajectory_scores(session: Session, rows: list[tuple[int, int, float | None, float | None]]) -> None:
    """rows: (group_pk, idx, total_reward, outcome)."""
    if not rows:
        return
    pks, idxs, totals, outcomes = map(list, zip(*rows, strict=True))
    session.execute(
        text(
            "UPDATE trajectories t SET total_reward = v.total, outcome = v.outcome"
            " FROM unnest(CAST(:pks AS bigint[]), CAST(:idxs AS int[]), CAST(:totals AS float8[]),"
            " CAST(:outcomes AS float8[])) AS v(pk, idx, total, outcome)"
            " WHERE t.group_pk = v.pk AND t.idx = v.idx"
        ),
        {"pks": pks, "idxs": idxs, "totals": totals, "outcomes": outcomes},
    )
