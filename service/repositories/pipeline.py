"""Statements of the score / curate worker: claiming work with SKIP LOCKED and bulk writes (unnest)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, or_, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, selectinload

from service.models import Decision, Group, Prompt, Reward, SamplingRequest


def claim_groups(session: Session, status: str, limit: int) -> list[Group]:
    """Lock up to ``limit`` groups in ``status`` that nobody else holds; the lock lives until commit,
    so two workers never work on the same group and a crashed worker's groups come back by themselves."""
    now = datetime.now(UTC)
    stmt = (
        select(Group)
        .where(Group.status == status, or_(Group.retry_at.is_(None), Group.retry_at <= now))
        .order_by(Group.pk)
        .limit(limit)
        .with_for_update(skip_locked=True, of=Group)
        .options(selectinload(Group.trajectories))
    )
    return list(session.execute(stmt).scalars())


def prompts_by_id(session: Session, ids: set[str]) -> dict[str, Prompt]:
    return {p.id: p for p in session.execute(select(Prompt).where(Prompt.id.in_(ids))).scalars()}


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


def update_trajectory_decisions(session: Session, rows: list[tuple[int, int, float, str, str]]) -> None:
    """rows: (group_pk, idx, advantage, action, reason)."""
    if not rows:
        return
    pks, idxs, advs, actions, reasons = map(list, zip(*rows, strict=True))
    session.execute(
        text(
            "UPDATE trajectories t SET advantage = v.adv, action = v.action, reason = v.reason"
            " FROM unnest(CAST(:pks AS bigint[]), CAST(:idxs AS int[]), CAST(:advs AS float8[]),"
            " CAST(:actions AS text[]), CAST(:reasons AS text[])) AS v(pk, idx, adv, action, reason)"
            " WHERE t.group_pk = v.pk AND t.idx = v.idx"
        ),
        {"pks": pks, "idxs": idxs, "advs": advs, "actions": actions, "reasons": reasons},
    )


def update_groups(session: Session, rows: list[dict[str, Any]]) -> None:
    """Bulk UPDATE by primary key; every row has the same keys (``pk`` plus the columns to set)."""
    if rows:
        stmt = Group.__table__.update().where(Group.__table__.c.pk == bindparam("_pk"))
        session.execute(stmt, [_rename_pk(r) for r in rows])


def _rename_pk(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k != "pk"}
    out["_pk"] = row["pk"]
    return out


def insert_decisions(session: Session, rows: list[dict[str, Any]]) -> None:
    if rows:
        session.execute(insert(Decision.__table__), rows)


def insert_sampling_requests(session: Session, rows: list[dict[str, Any]]) -> None:
    if rows:
        session.execute(insert(SamplingRequest.__table__), rows)


def record_outcomes(session: Session, rows: list[tuple[str, float]], keep_last: int = 16) -> None:
    """Append each group's outcome mean to its prompt's recent outcomes; pass_rate = their mean."""
    if not rows:
        return
    ids, means = map(list, zip(*rows, strict=True))
    last = (
        "(SELECT x, ord FROM jsonb_array_elements(p.recent_outcomes || v.ms) WITH ORDINALITY AS e(x, ord)"
        " ORDER BY ord DESC LIMIT :keep) AS last"
    )
    session.execute(
        text(
            "UPDATE prompts p SET n_groups = p.n_groups + v.n,"
            f" recent_outcomes = (SELECT jsonb_agg(x ORDER BY ord) FROM {last}),"
            f" pass_rate = (SELECT avg(x::float8) FROM {last})"
            " FROM (SELECT id, count(*) AS n, jsonb_agg(m) AS ms FROM unnest(CAST(:ids AS text[]),"
            " CAST(:means AS float8[])) AS u(id, m) GROUP BY id) AS v"
            " WHERE p.id = v.id"
        ),
        {"ids": ids, "means": means, "keep": keep_last},
    )


def backoff_until(attempts: int) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=min(60.0, 0.5 * 2**attempts))


def trajectory_components(
    session: Session, group_pks: list[int], spec: tuple[str, int]
) -> dict[tuple[int, int], dict[str, float | None]]:
    """(group_pk, idx) -> component -> value, for one spec version."""
    stmt = select(Reward.group_pk, Reward.idx, Reward.component, Reward.value).where(
        Reward.group_pk.in_(group_pks), Reward.spec_name == spec[0], Reward.spec_version == spec[1]
    )
    out: dict[tuple[int, int], dict[str, float | None]] = {}
    for pk, idx, comp, value in session.execute(stmt):
        out.setdefault((pk, idx), {})[comp] = value
    return out

