"""Statements of the score / curate worker: claiming work with SKIP LOCKED, and the few writes both stages
make (group status, decisions, the prompts they read). Each stage's own statements are in its domain's
``repository.py`` (``service.scoring``, ``service.curation``)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import or_, select, text
from sqlalchemy.orm import Session, selectinload

from service.store.models import Group


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


DIED_IN_BATCH = "died-in-batch:"  # prefix of the claim token of a group whose batch's worker died

_REFUND_SQL = (
    "UPDATE groups SET score_attempts = greatest(score_attempts - 1, 0), claimed_by = :prefix || claimed_by"
    " WHERE pk IN (SELECT g.pk FROM groups g WHERE {claimable} AND g.claimed_by IS NOT NULL"
    " AND g.claimed_by NOT LIKE :prefix || '%' AND g.claimed_by IN (SELECT d.claimed_by FROM groups d"
    " WHERE d.status = 'received' AND d.claimed_until < clock_timestamp() AND d.claimed_by IS NOT NULL"
    " GROUP BY d.claimed_by HAVING count(*) > 1) ORDER BY g.pk FOR UPDATE SKIP LOCKED)"
)


def refund_dead_batches(session: Session) -> int:
    """Groups of a batch claim whose worker died (the claim expired, nothing written, more than one group
    under the token) get that attempt back: nothing says which of them, if any, killed the worker (an
    OOM kill or kill -9 of the whole worker is no group's fault), so it neither counts toward
    ``max_attempts`` nor grows the backoff of a later real failure. They stay unfinished (the token keeps
    a ``died-in-batch:`` prefix), so each is then claimed alone: a group that kills its worker while
    claimed alone pays for it. One worker refunds at a time (an advisory lock; the others skip this
    step) so a batch is never half-seen. Returns how many groups got their attempt back."""
    if not session.execute(text("SELECT pg_try_advisory_xact_lock(26026)")).scalar():
        return 0
    rows = session.execute(text(_REFUND_SQL.format(claimable=_CLAIMABLE)), {"prefix": DIED_IN_BATCH})
    return rows.rowcount or 0


def claim_received(session: Session, token: str, limit: int, claim_seconds: float, max_attempts: int) -> list[int]:
    """Claim up to ``limit`` received groups for scoring outside any transaction: write the claim
    (``token``, until ``claim_seconds`` from now) and count the attempt now, before the work starts, so a
    group that kills or hangs its worker runs out of attempts instead of looping. Returns their pks.

    A group whose previous attempt did not finish (its claim expired with nothing written) is claimed
    alone: if it is the one that kills its worker, it burns only its own attempts, never those of the
    groups it was claimed with the first time (they are re-claimed alone too, once, and succeed). The
    attempt a batch lost with its dead worker is given back first (``refund_dead_batches``)."""
    refund_dead_batches(session)
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
