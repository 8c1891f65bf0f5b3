"""Statements of ``GET /v1/sampling/requests``: open requests claimed with SKIP LOCKED, prompts ranked by
curriculum priority in SQL, never-sampled prompts, and the rows that record what producers took."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, exists, literal, or_, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from filters.types import CurriculumConfig
from service.store.models import Dataset, Group, Prompt, SamplingRequest

# one lock serialises choosing prompts, so two producers never take the same never-sampled prompt
_CHOOSE_LOCK_KEY = 0x67726F7372656673  # "grosrefs"
# recent_outcomes keeps the last 16 group outcomes; a larger k can never be met
_MAX_K_TERMS = 64

Branch = tuple[str, str, CurriculumConfig]  # ("policy", ref, cfg) or ("dataset", name, cfg)


def _available(cutoff: datetime) -> Any:
    """Open, or taken by a producer whose lease ran out."""
    return or_(
        SamplingRequest.status == "open",
        and_(SamplingRequest.status == "taken", SamplingRequest.taken_at < cutoff),
    )


def open_rows(
    session: Session, reason: str, limit: int, dataset: str | None, cutoff: datetime, lock: bool
) -> list[SamplingRequest]:
    """Available rows of ``reason``, highest priority first; with ``lock`` they are locked (SKIP LOCKED)."""
    if limit <= 0:
        return []
    stmt = select(SamplingRequest).where(SamplingRequest.reason == reason, _available(cutoff))
    if dataset is not None:
        stmt = stmt.where(SamplingRequest.dataset == dataset)
    stmt = stmt.order_by(SamplingRequest.priority.desc(), SamplingRequest.pk).limit(limit)
    if lock:
        stmt = stmt.with_for_update(skip_locked=True)
    return list(session.execute(stmt).scalars())


def lock_choices(session: Session) -> None:
    """Transaction-scoped advisory lock around choosing prompts (released at commit / rollback)."""
    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _CHOOSE_LOCK_KEY})


def in_flight_prompts(session: Session, cutoff: datetime, dataset: str | None) -> set[str]:
    """Prompts a producer is sampling now (taken, lease running) or must sample (an open resample)."""
    taken = and_(SamplingRequest.status == "taken", SamplingRequest.taken_at >= cutoff)
    pending = and_(SamplingRequest.status == "open", SamplingRequest.reason.in_(("resample", "resume")))
    stmt = (
        select(SamplingRequest.prompt_id)
        .distinct()
        .where(SamplingRequest.prompt_id.is_not(None), or_(taken, pending))
    )
    if dataset is not None:
        stmt = stmt.where(SamplingRequest.dataset == dataset)
    return {pid for pid in session.execute(stmt).scalars() if pid is not None}


def dataset_policies(session: Session, dataset: str | None) -> dict[str, str]:
    """Dataset name -> its curation policy ref, for the configured datasets (one, or all)."""
    stmt = select(Dataset.name, Dataset.curation_policy).where(Dataset.curation_policy.is_not(None))
    if dataset is not None:
        stmt = stmt.where(Dataset.name == dataset)
    return {name: ref for name, ref in session.execute(stmt) if ref is not None}


def prompt_policies(session: Session, dataset: str | None) -> list[str]:
    """The distinct curation policy refs set on single prompts."""
    stmt = select(Prompt.curation_policy).distinct().where(Prompt.curation_policy.is_not(None))
    if dataset is not None:
        stmt = stmt.where(Prompt.dataset == dataset)
    return [ref for ref in session.execute(stmt).scalars() if ref is not None]


def _low_condition(cfg: CurriculumConfig, i: int) -> str:
    """SQL: the last k recent outcomes were all >= solved or all <= failed (filters.curriculum)."""
    if cfg.k > _MAX_K_TERMS:
        return "FALSE"
    terms = ", ".join(f"(p.recent_outcomes ->> {-j})::float8" for j in range(1, cfg.k + 1))
    return (
        f"(jsonb_array_length(p.recent_outcomes) >= {cfg.k}"
        f" AND (LEAST({terms}) >= :solved_{i} OR GREATEST({terms}) <= :failed_{i}))"
    )


def _value(cfg: CurriculumConfig, i: int, params: dict[str, Any]) -> str:
    """SQL: the priority under one config (its parameters added to ``params`` with suffix i)."""
    params.update({f"solved_{i}": cfg.solved, f"failed_{i}": cfg.failed, f"low_{i}": cfg.low_priority})
    return f"(CASE WHEN {_low_condition(cfg, i)} THEN CAST(:low_{i} AS float8) ELSE 1.0 END)"


def priority_sql(branches: Sequence[Branch], default: CurriculumConfig) -> tuple[str, dict[str, Any]]:
    """A SQL expression over ``prompts p``: the curriculum priority of each prompt (1.0, or the low
    priority of its config). A prompt's own policy wins over its dataset's, then the default."""
    params: dict[str, Any] = {}
    whens = []
    for i, (kind, name, cfg) in enumerate(branches):
        params[f"match_{i}"] = name
        match = (
            f"p.curation_policy = :match_{i}"
            if kind == "policy"
            else f"p.curation_policy IS NULL AND p.dataset = :match_{i}"
        )
        whens.append(f"WHEN {match} THEN {_value(cfg, i, params)}")
    fallback = _value(default, len(branches), params)
    return (f"(CASE {' '.join(whens)} ELSE {fallback} END)" if whens else fallback), params


def rank_prompts(
    session: Session,
    priority: tuple[str, dict[str, Any]],
    dataset: str | None,
    exclude: Iterable[str],
    limit: int,
) -> list[tuple[str, str, float]]:
    """(prompt_id, dataset, priority) of up to ``limit`` prompts with priority > 0, best first: normal
    priority before low, then fewest curated groups, then least recently sampled (oldest last group)."""
    if limit <= 0:
        return []
    expr, params = priority
    where = "p.dataset = :dataset AND " if dataset is not None else ""
    sql = text(
        f"WITH cand AS (SELECT p.id, p.dataset, p.n_groups, {expr} AS prio FROM prompts p"
        f" WHERE {where}NOT (p.id = ANY(CAST(:exclude AS text[])))"
        " ORDER BY prio DESC, p.n_groups, p.id LIMIT :pool)"
        " SELECT c.id, c.dataset, c.prio FROM cand c WHERE c.prio > 0"
        " ORDER BY c.prio DESC, c.n_groups,"
        " (SELECT max(g.pk) FROM groups g WHERE g.prompt_id = c.id) NULLS FIRST, c.id LIMIT :limit"
    )
    args = {**params, "dataset": dataset, "exclude": sorted(exclude), "pool": 4 * limit + 32, "limit": limit}
    return [(pid, ds, float(prio)) for pid, ds, prio in session.execute(sql, args)]


def never_sampled(
    session: Session, dataset: str | None, exclude: Iterable[str], limit: int
) -> list[tuple[str, str]]:
    """(prompt_id, dataset) of prompts without any group, oldest first."""
    if limit <= 0:
        return []
    stmt = (
        select(Prompt.id, Prompt.dataset)
        .where(Prompt.n_groups == 0, Prompt.id.not_in(list(exclude)))
        .where(~exists().where(Group.prompt_id == Prompt.id))
        .order_by(Prompt.created_at, Prompt.id)
        .limit(limit)
    )
    if dataset is not None:
        stmt = stmt.where(Prompt.dataset == dataset)
    return [(pid, ds) for pid, ds in session.execute(stmt)]


def last_groups(session: Session, prompt_ids: Sequence[str]) -> dict[str, tuple[dict[str, Any], int]]:
    """prompt id -> (sampling params, group size) of its latest group."""
    if not prompt_ids:
        return {}
    sql = text(
        "SELECT DISTINCT ON (prompt_id) prompt_id, sampling, n_trajectories FROM groups"
        " WHERE prompt_id = ANY(CAST(:ids AS text[])) ORDER BY prompt_id, pk DESC"
    )
    return {pid: (sampling, n) for pid, sampling, n in session.execute(sql, {"ids": list(prompt_ids)})}


def prompts_by_id(session: Session, ids: Iterable[str]) -> dict[str, Prompt]:
    ids = list(set(ids))
    if not ids:
        return {}
    return {p.id: p for p in session.execute(select(Prompt).where(Prompt.id.in_(ids))).scalars()}


def mark_taken(session: Session, rows: Sequence[tuple[int, str]], producer_id: str, now: datetime) -> None:
    """rows: (request pk, the prompt it is resolved to); one bulk UPDATE by primary key."""
    if rows:
        values = [
            {"pk": pk, "prompt_id": prompt_id, "status": "taken", "taken_by": producer_id, "taken_at": now}
            for pk, prompt_id in rows
        ]
        session.execute(update(SamplingRequest), values)


def insert_taken(session: Session, rows: list[dict[str, Any]]) -> list[int]:
    """Insert rows already taken (synthesized picks); returns their pks in order."""
    if not rows:
        return []
    stmt = insert(SamplingRequest).returning(SamplingRequest.pk, sort_by_parameter_order=True)
    return list(session.execute(stmt, rows).scalars())


def mark_done(session: Session, pks: Sequence[int], datasets: frozenset[str] | None = None) -> list[int]:
    """Mark the rows done (idempotent); returns the pks that exist (in ``datasets`` when given). An
    ``expired`` row stays expired: its remedy slot's deadline passed and its group went on without it, and a
    late "done" must not turn it back into one a fill may still answer (``service.curation.remedies``)."""
    if not pks:
        return []
    stmt = update(SamplingRequest).where(SamplingRequest.pk.in_(list(pks)))
    if datasets is not None:
        stmt = stmt.where(SamplingRequest.dataset.in_(sorted(datasets)))
    kept = case((SamplingRequest.status == "expired", SamplingRequest.status), else_=literal("done"))
    stmt = stmt.values(status=kept).returning(SamplingRequest.pk)
    return list(session.execute(stmt).scalars())


def slot_groups(session: Session, group_pks: Iterable[int]) -> dict[int, str]:
    """group pk -> group id, for the groups that remedy requests fill."""
    pks = sorted(set(group_pks))
    if not pks:
        return {}
    return {pk: gid for pk, gid in session.execute(select(Group.pk, Group.id).where(Group.pk.in_(pks)))}
