"""Statements about leases and the groups they hold.

Locking order, everywhere: a lease row first, then its groups. Claims lock ready groups with
``FOR UPDATE SKIP LOCKED`` and reapers lock expired leases the same way, so neither ever waits on the
other; an ack / nack locks its one lease row (waiting for a reaper that holds it) and then its groups.
Times come from the database clock (``clock_timestamp()``), so API replicas agree on expiry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Literal, cast

import numpy as np
from psycopg.rows import namedtuple_row
from sqlalchemy import CursorResult, and_, func, insert, or_, select, text, true, update
from sqlalchemy.orm import Session, selectinload

from filters.types import TRAINED_ACTIONS
from service.store.arrays import TOKEN_DTYPE, decode
from service.store.models import STALENESS_VERSION, Decision, Group, Lease, Trajectory

# trajectories that carry a gradient; 'mask' / 'drop' / 'resample' stay out of batches
DELIVERABLE_ACTIONS = TRAINED_ACTIONS
_DELIVERABLE = or_(Trajectory.action.is_(None), Trajectory.action.in_(DELIVERABLE_ACTIONS))


def db_now(session: Session) -> datetime:
    return session.execute(select(func.clock_timestamp())).scalar_one()


# -- reaping -------------------------------------------------------------------------------------------
def lock_expired_leases(session: Session, limit: int = 1000) -> list[str]:
    """Active leases past their deadline, locked; leases another transaction holds are skipped."""
    stmt = (
        select(Lease.id)
        .where(Lease.status == "active", Lease.expires_at < func.clock_timestamp())
        .order_by(Lease.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list(session.execute(stmt).scalars())


def end_leases(session: Session, lease_ids: Sequence[str], status: str) -> None:
    if lease_ids:
        stmt = (
            update(Lease)
            .where(Lease.id.in_(lease_ids))
            .values(status=status, ended_at=func.clock_timestamp())
            .execution_options(synchronize_session=False)
        )
        session.execute(stmt)


def end_lease(session: Session, lease_id: str, status: str) -> datetime | None:
    """One lease -> ``status``; returns its ``ended_at`` (database clock)."""
    stmt = (
        update(Lease)
        .where(Lease.id == lease_id)
        .values(status=status, ended_at=func.clock_timestamp())
        .returning(Lease.ended_at)
        .execution_options(synchronize_session=False)
    )
    return session.execute(stmt).scalar_one()


def release_groups(session: Session, lease_ids: Sequence[str]) -> int:
    """Groups still held by these leases go back to 'ready'; returns how many."""
    if not lease_ids:
        return 0
    stmt = (
        update(Group)
        .where(Group.lease_id.in_(lease_ids), Group.status == "leased")
        .values(status="ready", lease_id=None)
        .execution_options(synchronize_session=False)
    )
    return cast(CursorResult[Any], session.execute(stmt)).rowcount or 0


# -- claiming ------------------------------------------------------------------------------------------
def lock_ready_groups(
    session: Session,
    *,
    min_version: int | None,
    order: Literal["oldest", "freshest"],
    after: tuple[int, int] | None,
    limit: int,
    datasets: frozenset[str] | None = None,
    need_logprobs: bool = False,
) -> list[Any]:
    """Up to ``limit`` ready groups in delivery order, locked ``FOR UPDATE SKIP LOCKED``, each with its
    deliverable trajectories and their token ids: rows (pk, policy_version, n, tokens), n = 0 for a group
    with nothing deliverable. One statement (a lease's round trips are most of its cost on a busy host).

    ``after`` = (policy_version, pk) of the last row of the previous chunk (keyset pagination);
    'oldest' is ingest order (pk), which also puts redelivered groups first; 'freshest' is
    policy_version descending, then pk.
    """
    sizes = (
        select(func.count().label("n"), func.coalesce(func.sum(Trajectory.seq_len), 0).label("tokens"))
        .where(Trajectory.group_pk == Group.pk, _DELIVERABLE)
        .lateral("sizes")
    )
    stmt = select(Group.pk, Group.policy_version, sizes.c.n, sizes.c.tokens).join(sizes, true())
    stmt = stmt.where(Group.status == "ready")
    if min_version is not None:  # by the group's oldest token (a fill or a resume may be older than the group)
        stmt = stmt.where(STALENESS_VERSION >= min_version)
    if datasets is not None:
        stmt = stmt.where(Group.dataset.in_(sorted(datasets)))
    if need_logprobs:
        bare = select(Trajectory.idx).where(Trajectory.group_pk == Group.pk, Trajectory.logprobs.is_(None))
        stmt = stmt.where(~bare.exists())
    if order == "oldest":
        stmt = stmt.order_by(Group.pk)
        if after is not None:
            stmt = stmt.where(Group.pk > after[1])
    else:
        stmt = stmt.order_by(Group.policy_version.desc(), Group.pk)
        if after is not None:
            version, pk = after
            stmt = stmt.where(
                or_(Group.policy_version < version, and_(Group.policy_version == version, Group.pk > pk))
            )
    return list(session.execute(stmt.limit(limit).with_for_update(of=Group, skip_locked=True)).all())


def lock_request_id(session: Session, request_id: str) -> None:
    """Serialise lease requests that share a request_id (transaction-scoped advisory lock)."""
    session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:rid, 7))"), {"rid": request_id})


def insert_lease(session: Session, row: dict[str, Any], lease_seconds: float) -> Any:
    """Mark the lease's groups (``row["group_pks"]``) leased and insert the lease, expiring ``lease_seconds``
    from now (database clock), in one statement; returns its times."""
    marked = (
        update(Group)
        .where(Group.pk.in_(row["group_pks"]))
        .values(status="leased", lease_id=row["id"])
        .cte("marked")
    )
    expires = func.clock_timestamp() + func.make_interval(0, 0, 0, 0, 0, 0, lease_seconds)
    stmt = insert(Lease).values(**row, expires_at=expires).returning(Lease.created_at, Lease.expires_at)
    return session.execute(stmt.add_cte(marked)).one()


# -- reading -------------------------------------------------------------------------------------------
def get_lease(session: Session, lease_id: str, *, for_update: bool = False) -> Lease | None:
    stmt = select(Lease).where(Lease.id == lease_id)
    if for_update:
        stmt = stmt.with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def lease_by_request_id(session: Session, request_id: str) -> Lease | None:
    return session.execute(select(Lease).where(Lease.request_id == request_id)).scalar_one_or_none()


def group_ids(session: Session, group_pks: Sequence[int]) -> dict[int, str]:
    if not group_pks:
        return {}
    return {pk: gid for pk, gid in session.execute(select(Group.pk, Group.id).where(Group.pk.in_(group_pks)))}


_BATCH_ROWS_SQL = """
SELECT g.pk, g.id, g.prompt_id, g.policy_version, t.idx,
       -- a member's whole arrays: its group's shared prefix (prompt_prefixes, 0016), if any, then its own bytes
       CASE WHEN t.prefix_len = 0 THEN t.token_ids ELSE p.token_ids || t.token_ids END AS token_ids,
       CASE WHEN t.prefix_len = 0 THEN t.loss_mask ELSE p.loss_mask || t.loss_mask END AS loss_mask,
       CASE WHEN t.prefix_len = 0 THEN t.logprobs ELSE p.logprobs || t.logprobs END AS logprobs,
       CASE WHEN t.prefix_len = 0 THEN t.versions ELSE p.versions || t.versions END AS versions, t.advantage, t.total_reward, t.segments, t.segment_advantages, t.finish_reason,
       CASE WHEN jsonb_typeof(g.sampling -> 'temperature') = 'number'
            THEN (g.sampling ->> 'temperature')::float8 END AS temperature,
       rw.rewards,
       -- how the trainer weighs a segmented trajectory's segments: the group's curation policy's mode
       CASE WHEN t.segments IS NOT NULL THEN cp.body ->> 'segment_advantage' END AS segment_advantage
  FROM trajectories t JOIN groups g ON g.pk = t.group_pk
  LEFT JOIN prompt_prefixes p ON p.group_pk = t.group_pk AND t.prefix_len > 0
  LEFT JOIN curation_policies cp ON cp.name = g.curation_policy_name AND cp.version = g.curation_policy_version
  -- the components of the spec version that scored the group (uq_rewards_key's index); NULL: none stored
  LEFT JOIN LATERAL (
       SELECT jsonb_object_agg(r.component, CASE WHEN r.value IN ('NaN', 'Infinity', '-Infinity') THEN NULL
                                                 ELSE r.value END) AS rewards
         FROM rewards r
        WHERE r.group_pk = t.group_pk AND r.idx = t.idx
          AND r.spec_name = g.reward_spec_name AND r.spec_version = g.reward_spec_version) rw ON true
 WHERE t.group_pk = ANY(%(pks)s) AND (t.action IS NULL OR t.action = ANY(%(actions)s))
 ORDER BY t.group_pk, t.idx
"""


def batch_rows(session: Session, group_pks: Sequence[int]) -> list[Any]:
    """One row per deliverable trajectory of these groups, with its group's ids, its ``finish_reason``, its
    ``rewards`` ({component: value | None}, the spec version that scored the group; None: no component
    stored) and, when segmented, its ``segment_advantage`` (the mode of the curation policy that curated
    the group, which gave its segments their advantages); in group-pk, idx order.

    Fetched in PostgreSQL's binary format on the session's own connection (same transaction): bytea
    arrives as raw bytes instead of hex text, which halves the cost of the largest read of a lease.
    """
    driver = session.connection().connection.driver_connection
    with driver.cursor(binary=True, row_factory=namedtuple_row) as cur:  # type: ignore[union-attr]
        cur.execute(_BATCH_ROWS_SQL, {"pks": list(group_pks), "actions": list(DELIVERABLE_ACTIONS)})
        return cur.fetchall()


# -- acking --------------------------------------------------------------------------------------------
def count_held(session: Session, lease_id: str) -> int:
    """Groups that this lease still holds (lease_id fenced, status 'leased')."""
    stmt = select(func.count()).where(Group.lease_id == lease_id, Group.status == "leased")
    return int(session.execute(stmt).scalar_one())


def consume_groups(session: Session, lease_id: str, current_version: int) -> int:
    """Held groups -> 'consumed', with consumed_at and staleness = current version - the version of the
    group's oldest token (``STALENESS_VERSION``)."""
    stmt = (
        update(Group)
        .where(Group.lease_id == lease_id, Group.status == "leased")
        .values(
            status="consumed",
            consumed_at=func.clock_timestamp(),
            staleness=current_version - STALENESS_VERSION,
        )
        .execution_options(synchronize_session=False)
    )
    return cast(CursorResult[Any], session.execute(stmt)).rowcount or 0


# -- heartbeat, trainer refusals, staleness -------------------------------------------------------------
def extend_lease(session: Session, lease_id: str, lease_seconds: float) -> datetime:
    """Move an active lease's deadline to ``lease_seconds`` from now (database clock)."""
    expires = func.clock_timestamp() + func.make_interval(0, 0, 0, 0, 0, 0, lease_seconds)
    stmt = (
        update(Lease)
        .where(Lease.id == lease_id, Lease.status == "active")
        .values(expires_at=expires)
        .returning(Lease.expires_at)
        .execution_options(synchronize_session=False)
    )
    return session.execute(stmt).scalar_one()


def set_reason(session: Session, lease_id: str, reason: str | None) -> None:
    if reason is not None:
        session.execute(update(Lease).where(Lease.id == lease_id).values(reason=reason)
                        .execution_options(synchronize_session=False))


def _outside_vocab(g: Group, vocab_size: int | None) -> str | None:
    """The first stored token id >= ``vocab_size`` (or < 0) in ``g``, as a reason, or None."""
    if vocab_size is None:
        return None
    for t in g.trajectories:
        tokens = decode(t.token_ids, TOKEN_DTYPE)
        if tokens is None or tokens.size == 0:
            continue
        outside = np.flatnonzero((tokens < 0) | (tokens >= vocab_size))
        if outside.size:
            pos = int(outside[0])
            return (f"untrainable: trajectory {t.idx} token id {int(tokens[pos])} at position {pos} is outside"
                    f" the trainer's vocabulary (vocab_size {vocab_size})")
    return None


def drop_held_groups(
    session: Session, lease_id: str, reason: str, untrainable_reason: Callable[[Group], str | None],
    vocab_size: int | None = None,
) -> tuple[list[int], list[int]]:
    """A trainer's ``nack(drop=True)``, re-checked: of the groups still held by this lease, those the
    service itself finds untrainable (a trajectory without token ids / loss mask, or, when the trainer
    sent its ``vocab_size``, a stored token id outside [0, vocab_size)) -> 'dropped' ('untrainable'); the
    others are kept (they go back to the queue with the lease) and get a 'keep' decision recording the
    refusal. -> (dropped pks, kept pks)."""
    held = (
        select(Group)
        .where(Group.lease_id == lease_id, Group.status == "leased")
        .order_by(Group.pk)
        .with_for_update(of=Group)
        .options(selectinload(Group.trajectories))
    )
    bad, kept = [], []
    for g in session.execute(held).scalars():
        why = untrainable_reason(g) or _outside_vocab(g, vocab_size)
        (bad if why else kept).append((g.pk, why))
    if bad:
        session.execute(
            update(Group).where(Group.pk.in_([pk for pk, _ in bad]))
            .values(status="dropped", drop_reason="untrainable", lease_id=None)
            .execution_options(synchronize_session=False)
        )
    _decisions(session, [(pk, "untrainable", f"{why}; the trainer refused it: {reason}") for pk, why in bad])
    _decisions(session, [(pk, "nack", f"kept: the trainer asked to drop it ({reason}) but it has token ids and"
                                      " a loss mask" + ("" if vocab_size is None else f", every token id below {vocab_size}")
                                      + "; back to the queue") for pk, _ in kept], action="keep")
    return [pk for pk, _ in bad], [pk for pk, _ in kept]


_STALE_SQL = """
WITH cur AS (SELECT coalesce(max(version), 0) AS v FROM policy_versions),
stale AS (
  SELECT g.pk, coalesce(CAST(:ms AS numeric), (c.body->>'max_staleness')::numeric) AS ms, (SELECT v FROM cur) AS v
    FROM groups g
    LEFT JOIN curation_policies c
      ON c.name = g.curation_policy_name AND c.version = g.curation_policy_version
   WHERE g.status = 'ready'
     AND (CAST(:ms AS numeric) IS NOT NULL OR jsonb_typeof(c.body->'max_staleness') = 'number')
     AND (SELECT v FROM cur) - coalesce(g.oldest_version, g.policy_version)
         > coalesce(CAST(:ms AS numeric), (c.body->>'max_staleness')::numeric)
     AND (CAST(:all_datasets AS boolean) OR g.dataset = ANY(CAST(:datasets AS text[])))
   ORDER BY g.pk LIMIT :n FOR UPDATE OF g SKIP LOCKED)
UPDATE groups g SET status = 'dropped', drop_reason = 'stale'
  FROM stale WHERE g.pk = stale.pk
RETURNING g.pk, g.policy_version, g.oldest_version, stale.ms, stale.v
"""


def drop_stale_ready(
    session: Session,
    limit: int = 1000,
    *,
    max_staleness: int | None = None,
    datasets: frozenset[str] | None = None,
) -> list[int]:
    """Ready groups sampled more than ``max_staleness`` versions behind the latest published policy ->
    'dropped' ('stale'), each with a decision. Returns how many.

    ``max_staleness`` None: each group's curation policy's ``max_staleness`` (groups without one stay).
    Given (a lease's ``max_staleness``): that limit, over ``datasets`` (None: every dataset) -- the groups
    such a lease passes over and would otherwise leave 'ready' for ever. -> their pks."""
    params = {"n": limit, "ms": max_staleness, "all_datasets": datasets is None,
              "datasets": sorted(datasets or ())}
    rows = session.execute(text(_STALE_SQL), params).all()
    source = "curation policy" if max_staleness is None else "lease"
    _decisions(session, [
        (pk, "stale", f"stale: sampled at policy version {pv}"
                      + ("" if oldest is None else f" (its oldest token by version {oldest})")
                      + f", trainer at {v}, {source} max_staleness {ms}")
        for pk, pv, oldest, ms, v in rows
    ])
    return [pk for pk, *_ in rows]


def _decisions(session: Session, rows: list[tuple[int, str, str]], action: str = "drop") -> None:
    if rows:
        session.execute(insert(Decision), [
            {"group_pk": pk, "idx": None, "action": action, "rule": rule, "reason": reason} for pk, rule, reason in rows
        ])
