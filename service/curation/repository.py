"""Statements of the curate stage: per-trajectory decisions and advantages (unnest), resample requests, the
prompts' outcome history, and the scores curation reads back."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import BigInteger, any_, func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, selectinload

from service.store.models import Decision, Group, Prompt, Reward, SamplingRequest
from service.store.queries import array_param


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


def update_segment_advantages(session: Session, rows: list[tuple[int, int, list[float]]]) -> None:
    """rows: (group_pk, idx, one advantage per segment)."""
    if not rows:
        return
    pks, idxs, advs = map(list, zip(*rows, strict=True))
    session.execute(
        text(
            "UPDATE trajectories t SET segment_advantages = v.advs"
            " FROM unnest(CAST(:pks AS bigint[]), CAST(:idxs AS int[]), CAST(:advs AS jsonb[]))"
            " AS v(pk, idx, advs) WHERE t.group_pk = v.pk AND t.idx = v.idx"
        ),
        {"pks": pks, "idxs": idxs, "advs": [orjson.dumps(a).decode() for a in advs]},
    )


def insert_sampling_requests(session: Session, rows: list[dict[str, Any]]) -> None:
    """One INSERT per shape of row (a refill names no slot; a resume carries a checkpoint)."""
    shapes: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        shapes.setdefault(tuple(sorted(k for k, v in row.items() if v is not None)), []).append(row)
    for keys, same in shapes.items():
        session.execute(insert(SamplingRequest.__table__), [{k: r[k] for k in keys} for r in same])


def record_outcomes(session: Session, rows: list[tuple[str, float]], keep_last: int = 16) -> None:
    """Append each group's outcome mean to its prompt's recent outcomes; pass_rate = their mean."""
    if not rows:
        return
    rows = sorted(rows)
    ids, means = map(list, zip(*rows, strict=True))
    # lock the prompt rows in one global order first: two workers never wait on each other in a cycle.
    # COLLATE "C" = code point order = Python's sorted(), the order ingest's upserts lock them in (the
    # database's default collation, en_US / ICU, orders 'a', 'B', 'a_1' otherwise)
    session.execute(
        select(Prompt.id).where(Prompt.id.in_(set(ids))).order_by(Prompt.id.collate("C")).with_for_update()
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
    stmt = select(Prompt).where(Prompt.id.in_(by_prompt)).order_by(Prompt.id.collate("C")).with_for_update()
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


def insert_decisions(session: Session, rows: list[dict[str, Any]]) -> None:
    if rows:
        session.execute(insert(Decision.__table__), rows)


# -- remedy slots (service.curation.remedies) ------------------------------------------------------------
_SLOT = (SamplingRequest.idx.is_not(None), SamplingRequest.reason.in_(("resample", "resume")))


def slot_history(session: Session, group_pks: list[int]) -> dict[tuple[int, int], list[SamplingRequest]]:
    """(group pk, idx) -> the remedy requests ever made for that slot, oldest first."""
    if not group_pks:
        return {}
    stmt = (select(SamplingRequest).where(SamplingRequest.source_group_pk.in_(group_pks), *_SLOT)
            .order_by(SamplingRequest.pk))
    out: dict[tuple[int, int], list[SamplingRequest]] = {}
    for r in session.execute(stmt).scalars():
        out.setdefault((r.source_group_pk, r.idx), []).append(r)  # type: ignore[arg-type]
    return out


def slot_requests(session: Session, group_pk: int, idx: int) -> list[SamplingRequest]:
    """The remedy requests of one slot, oldest first, locked (the group row is locked before them)."""
    stmt = (select(SamplingRequest)
            .where(SamplingRequest.source_group_pk == group_pk, SamplingRequest.idx == idx, *_SLOT)
            .order_by(SamplingRequest.pk).with_for_update())
    return list(session.execute(stmt).scalars())


def count_open_slots(session: Session, group_pk: int) -> int:
    """Slots of the group still awaited: a remedy request neither filled nor expired."""
    stmt = select(func.count()).where(SamplingRequest.source_group_pk == group_pk, *_SLOT,
                                      SamplingRequest.filled_at.is_(None), SamplingRequest.status != "expired")
    return int(session.execute(stmt).scalar_one())


def mark_filled(session: Session, pk: int, fill_hash: str, now: datetime) -> None:
    session.execute(update(SamplingRequest).where(SamplingRequest.pk == pk)
                    .values(filled_at=now, fill_hash=fill_hash, status="done"))


def due_waiting(session: Session, now: datetime, limit: int) -> list[Group]:
    """Waiting groups whose deadline passed, locked (SKIP LOCKED: a fill in progress keeps its group)."""
    stmt = (select(Group).where(Group.status == "waiting", Group.wait_until <= now).order_by(Group.wait_until)
            .limit(limit).with_for_update(skip_locked=True, of=Group).options(selectinload(Group.trajectories)))
    return list(session.execute(stmt).scalars())


def expire_slots(session: Session, group_pk: int) -> list[SamplingRequest]:
    """Mark the group's unfilled slots ``expired``; returns them."""
    stmt = (update(SamplingRequest)
            .where(SamplingRequest.source_group_pk == group_pk, *_SLOT, SamplingRequest.filled_at.is_(None),
                   SamplingRequest.status != "expired")
            .values(status="expired").returning(SamplingRequest))
    return list(session.execute(stmt).scalars())


def with_decision(session: Session, pks: list[int], rules: tuple[str, ...]) -> set[int]:
    """Of ``pks``, the groups with a decision row of one of ``rules`` (e.g. the markers a rescore / recurate leaves)."""
    if not pks:
        return set()
    stmt = select(Decision.group_pk).where(
        Decision.group_pk == any_(array_param("pks", pks, BigInteger)), Decision.rule.in_(rules)).distinct()
    return set(session.execute(stmt).scalars())
