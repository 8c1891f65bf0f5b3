"""Statements of the score / curate worker: claiming work with SKIP LOCKED and bulk writes (unnest)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, or_, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, selectinload

from service.store.models import Decision, Group, Prompt, Reward, SamplingRequest


def claim_groups(session: Session, status: str, limit: int) -> list[Group]:
    """Lock up to ``limit`` groups in ``status`` that nobody else holds, for work done inside this
    transaction (curation: no outside calls); the lock lives until commit."""
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


_CLAIMABLE = (
    "g.status = 'received' AND (g.retry_at IS NULL OR g.retry_at <= clock_timestamp())"
    " AND (g.claimed_until IS NULL OR g.claimed_until < clock_timestamp())"
)


_UNFINISHED = "g.claimed_by IS NOT NULL"  # claimed, claim expired, nothing written back (a write clears it)

_CLAIM_SQL = (
    "UPDATE groups SET claimed_by = :token, score_attempts = score_attempts + 1,"
    " claimed_until = clock_timestamp() + make_interval(secs => :secs)"
    " WHERE pk IN (SELECT g.pk FROM groups g WHERE {where} AND g.score_attempts < :max"
    " ORDER BY g.pk LIMIT :n FOR UPDATE SKIP LOCKED) RETURNING pk"
)


def claim_received(session: Session, token: str, limit: int, claim_seconds: float, max_attempts: int) -> list[int]:
    """Claim up to ``limit`` received groups for scoring outside any transaction: write the claim
    (``token``, until ``claim_seconds`` from now) and count the attempt now, before the work starts, so a
    group that kills or hangs its worker runs out of attempts instead of looping. Returns their pks.

    A group whose previous attempt did not finish (its claim expired with nothing written) is claimed
    alone: if it is the one that kills its worker, it burns only its own attempts, never those of the
    groups it was claimed with the first time (they are re-claimed alone too, once, and succeed)."""
    args = {"token": token, "secs": claim_seconds, "max": max_attempts}
    rows = session.execute(text(_CLAIM_SQL.format(where=f"{_CLAIMABLE} AND {_UNFINISHED}")), args | {"n": 1})
    pks = [pk for (pk,) in rows]
    if not pks:
        rows = session.execute(text(_CLAIM_SQL.format(where=f"{_CLAIMABLE} AND g.claimed_by IS NULL")),
                               args | {"n": limit})
        pks = [pk for (pk,) in rows]
    return sorted(pks)


def extend_claim(session: Session, token: str, claim_seconds: float) -> int:
    """Heartbeat of a claim: its groups' ``claimed_until`` moves to ``claim_seconds`` from now, for those
    still claimed by ``token`` -> how many (0: the claim was taken over; the worker's write will be fenced)."""
    rows = session.execute(
        text("UPDATE groups SET claimed_until = clock_timestamp() + make_interval(secs => :secs)"
             " WHERE claimed_by = :token AND status = 'received'"),
        {"token": token, "secs": claim_seconds},
    )
    return rows.rowcount or 0


def fail_exhausted(session: Session, max_attempts: int, limit: int = 1000) -> list[tuple[int, int]]:
    """Received groups whose every attempt was used up by a worker that never wrote back (crashed, hung,
    killed) -> ``reward_error``; returns (pk, attempts) of each."""
    rows = session.execute(
        text(
            "UPDATE groups SET status = 'reward_error', drop_reason = 'reward_error', claimed_by = NULL,"
            " claimed_until = NULL, score_error = coalesce(score_error, 'no attempt finished')"
            f" WHERE pk IN (SELECT g.pk FROM groups g WHERE {_CLAIMABLE} AND g.score_attempts >= :max"
            " ORDER BY g.pk LIMIT :n FOR UPDATE SKIP LOCKED) RETURNING pk, score_attempts"
        ),
        {"max": max_attempts, "n": limit},
    )
    return [(pk, n) for pk, n in rows]


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
    rows = sorted(rows)
    ids, means = map(list, zip(*rows, strict=True))
    # lock the prompt rows in one global order first: two workers never wait on each other in a cycle
    session.execute(
        select(Prompt.id).where(Prompt.id.in_(set(ids))).order_by(Prompt.id).with_for_update()
    ).all()
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


def retract_outcomes(session: Session, rows: list[tuple[str, float]]) -> None:
    """Undo ``record_outcomes`` for these groups (a rescore / recurate will record them again): each
    group's outcome leaves its prompt's recent outcomes (the newest equal entry) and n_groups."""
    if not rows:
        return
    by_prompt: dict[str, list[float]] = {}
    for pid, mean in rows:
        by_prompt.setdefault(pid, []).append(mean)
    stmt = select(Prompt).where(Prompt.id.in_(by_prompt)).order_by(Prompt.id).with_for_update()
    for p in session.execute(stmt).scalars():
        recent = [float(x) for x in p.recent_outcomes]
        for mean in by_prompt[p.id]:
            hits = [i for i, x in enumerate(recent) if abs(x - mean) < 1e-12]
            if hits:
                del recent[hits[-1]]
        p.recent_outcomes = recent
        p.n_groups = max(0, p.n_groups - len(by_prompt[p.id]))
        p.pass_rate = sum(recent) / len(recent) if recent else None
    session.flush()


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

