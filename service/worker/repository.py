"""Statements of the score / curate worker: claiming work with SKIP LOCKED, and the few writes both stages
make (group status, decisions, the prompts they read). Each stage's own statements are in its domain's
``repository.py`` (``service.scoring``, ``service.curation``)."""

from __future__ import annotations

from sqlalchemy import func, or_, select, text
from sqlalchemy.orm import Session, selectinload

from service.store.models import Group


def claim_groups(session: Session, status: str, limit: int) -> list[Group]:
    """Lock up to ``limit`` groups in ``status`` that nobody else holds, for work done inside this
    transaction (curation: no outside calls); the lock lives until commit."""
    stmt = (
        select(Group)
        .where(Group.status == status, or_(Group.retry_at.is_(None), Group.retry_at <= func.clock_timestamp()))
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


_CLAIM_SQL = (
    "UPDATE groups SET claimed_by = :token, score_attempts = score_attempts + 1,"
    " claimed_until = clock_timestamp() + make_interval(secs => :secs)"
    " WHERE pk IN (SELECT g.pk FROM groups g WHERE {where} AND g.score_attempts < :max"
    " ORDER BY g.pk LIMIT :n FOR UPDATE SKIP LOCKED) RETURNING pk"
)


KILLER_ERROR = "its score worker died "  # how score_error of a group ended as the killer begins
DIED_IN_BATCH = "died-in-batch:"  # prefix of the claim token of a group whose claim's worker died

# The survivors of a dead claim (expired, nothing written, not yet seen here): each gets its attempt back;
# a claim of one group counts a death of that group; a claim of several is split in halves (by pk), each
# half keyed by a token of its own (``died-in-batch:a:<dead token>`` / ``b:`` / ``solo:``).
_REFUND_SQL = (
    "WITH dead AS (SELECT g.pk, g.claimed_by, count(*) OVER (PARTITION BY g.claimed_by) AS n,"
    " row_number() OVER (PARTITION BY g.claimed_by ORDER BY g.pk) AS rn FROM groups g"
    " WHERE {claimable} AND g.claimed_by IS NOT NULL AND g.claimed_by NOT LIKE :prefix || '%')"
    " UPDATE groups t SET score_attempts = greatest(t.score_attempts - 1, 0),"
    " score_deaths = t.score_deaths + CASE WHEN d.n = 1 THEN 1 ELSE 0 END,"
    " death_tokens = t.death_tokens || CASE WHEN d.n = 1 THEN ARRAY[d.claimed_by] ELSE ARRAY[]::text[] END,"
    " claimed_by = :prefix || CASE WHEN d.n = 1 THEN 'solo' WHEN d.rn <= (d.n + 1) / 2 THEN 'a' ELSE 'b' END"
    " || ':' || d.claimed_by"
    " FROM dead d WHERE t.pk = d.pk AND t.claimed_by = d.claimed_by AND t.status = 'received'"
    " AND t.claimed_until < clock_timestamp() RETURNING t.pk, d.n"
)

# a claim of one dead claim's half: the half whose groups died alone the fewest times first (the likely
# innocent before the suspects), then by pk
_CLAIM_DIED_SQL = (
    "WITH k AS (SELECT g.claimed_by FROM groups g WHERE {claimable} AND g.claimed_by LIKE :prefix || '%'"
    " AND g.score_attempts < :max AND g.score_deaths <= :solo ORDER BY g.score_deaths, g.pk LIMIT 1)"
    " UPDATE groups SET claimed_by = :token, score_attempts = score_attempts + 1,"
    " claimed_until = clock_timestamp() + make_interval(secs => :secs)"
    " WHERE pk IN (SELECT g.pk FROM groups g JOIN k ON g.claimed_by = k.claimed_by WHERE {claimable}"
    " AND g.score_attempts < :max AND g.score_deaths <= :solo ORDER BY g.pk LIMIT :n FOR UPDATE OF g SKIP LOCKED)"
    " RETURNING pk"
)


def refund_dead_batches(session: Session) -> int:
    """Every group of a claim whose worker died (the claim expired, nothing written back) gets that attempt
    back: a worker's death (an OOM kill, a kill -9, a lost machine) is not a scoring failure, so it neither
    counts toward ``max_attempts`` nor grows the backoff of a later real failure. Nothing says which group,
    if any, killed the worker, so a dead claim of several groups is split in halves, each claimed again
    together (a bisection: a dead batch of B is back in 2 claims, a poison group alone after log2(B)
    deaths); a claim of one group that died counts a death of that group (``score_deaths``), and one that
    died alone more than ``max_solo_deaths`` times is the killer (``fail_killers``). One worker refunds at a
    time (an advisory lock; the others skip this step) so a batch is never half-seen. Call it in a
    transaction of its own (``pipeline.score_pass``): the lock lives until that commit, so a worker frozen
    later in its pass does not hold it, and a worker frozen inside it is ended by the server after
    ``worker_idle_in_transaction_s`` (``service.store.db.worker_engine``). Returns how many groups got
    their attempt back."""
    if not session.execute(text("SELECT pg_try_advisory_xact_lock(26026)")).scalar():
        return 0
    rows = session.execute(text(_REFUND_SQL.format(claimable=_CLAIMABLE)), {"prefix": DIED_IN_BATCH})
    return len(rows.all())


def claim_received(session: Session, token: str, limit: int, claim_seconds: float, max_attempts: int,
                   max_solo_deaths: int = 3, *, refund: bool = True) -> list[int]:
    """Claim up to ``limit`` received groups for scoring outside any transaction: write the claim
    (``token``, until ``claim_seconds`` from now) and count the attempt now, before the work starts, so a
    group that fails for real runs out of attempts instead of looping. Returns their pks.

    Dead claims are refunded and split first (``refund_dead_batches``; ``refund=False``: the caller did, in
    a transaction of its own, as ``pipeline.score_pass`` does); then the survivors of one half of
    a dead claim are claimed together (never mixed with fresh groups: if one of them kills this worker too,
    only they are suspects), and only when none is left, fresh groups. A group that died alone more than
    ``max_solo_deaths`` times is not claimed again (``fail_killers`` ends it)."""
    if refund:
        refund_dead_batches(session)
    args = {"token": token, "secs": claim_seconds, "max": max_attempts, "n": limit}
    rows = session.execute(text(_CLAIM_DIED_SQL.format(claimable=_CLAIMABLE)),
                           args | {"prefix": DIED_IN_BATCH, "solo": max_solo_deaths})
    pks = [pk for (pk,) in rows]
    if not pks:
        rows = session.execute(text(_CLAIM_SQL.format(where=f"{_CLAIMABLE} AND g.claimed_by IS NULL")), args)
        pks = [pk for (pk,) in rows]
    return sorted(pks)


def fail_killers(session: Session, max_solo_deaths: int, limit: int = 1000) -> list[tuple[int, int]]:
    """Received groups whose score worker died while each was claimed alone more than ``max_solo_deaths``
    times (the likely killers of their workers) -> ``reward_error``; returns (pk, deaths) of each."""
    rows = session.execute(
        text(
            "UPDATE groups SET status = 'reward_error', drop_reason = 'reward_error', claimed_by = NULL,"
            " claimed_until = NULL, score_error = :killer || score_deaths || ' times while it"
            " was scored alone (the likely killer of its worker)'"
            f" WHERE pk IN (SELECT g.pk FROM groups g WHERE {_CLAIMABLE} AND g.score_deaths > :solo"
            " AND g.claimed_by LIKE :prefix || '%' ORDER BY g.pk LIMIT :n FOR UPDATE SKIP LOCKED)"
            " RETURNING pk, score_deaths"
        ),
        {"solo": max_solo_deaths, "prefix": DIED_IN_BATCH, "n": limit, "killer": KILLER_ERROR},
    )
    return [(pk, n) for pk, n in rows]


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
    """Received groups whose every attempt was used up (``max_attempts`` lowered under them, or attempts
    counted before deaths were refunded) -> ``reward_error``; returns (pk, attempts) of each. A dead claim
    not yet refunded (``refund_dead_batches``) is left alone: its attempt is coming back."""
    rows = session.execute(
        text(
            "UPDATE groups SET status = 'reward_error', drop_reason = 'reward_error', claimed_by = NULL,"
            " claimed_until = NULL, score_error = coalesce(score_error, 'no attempt finished')"
            f" WHERE pk IN (SELECT g.pk FROM groups g WHERE {_CLAIMABLE} AND g.score_attempts >= :max"
            " AND (g.claimed_by IS NULL OR g.claimed_by LIKE :prefix || '%')"
            " ORDER BY g.pk LIMIT :n FOR UPDATE SKIP LOCKED) RETURNING pk, score_attempts"
        ),
        {"max": max_attempts, "n": limit, "prefix": DIED_IN_BATCH},
    )
    return [(pk, n) for pk, n in rows]


def take_back_deaths(session: Session, token: str, pks: list[int], max_solo_deaths: int) -> list[int]:
    """The worker of claim ``token`` is alive (its write came back, fenced: its heartbeat lapsed -- a DB
    failover or a pause longer than the claim -- and the claim was taken for dead): each of ``pks`` that
    counted a death of that claim takes it back, so a live worker's lapse never makes an innocent group
    the killer. A group already ended as the killer whose deaths fall back within ``max_solo_deaths`` is
    scored again. Returns the pks whose death was taken back."""
    rows = session.execute(
        text(
            "UPDATE groups SET score_deaths = greatest(score_deaths - 1, 0),"
            " death_tokens = array_remove(death_tokens, :token),"
            " status = CASE WHEN status = 'reward_error' AND score_deaths - 1 <= :solo"
            "  AND score_error LIKE :killer || '%' THEN 'received' ELSE status END,"
            " drop_reason = CASE WHEN status = 'reward_error' AND score_deaths - 1 <= :solo"
            "  AND score_error LIKE :killer || '%' THEN NULL ELSE drop_reason END,"
            " score_error = CASE WHEN status = 'reward_error' AND score_deaths - 1 <= :solo"
            "  AND score_error LIKE :killer || '%' THEN NULL ELSE score_error END"
            " WHERE pk = ANY(:pks) AND :token = ANY(death_tokens) RETURNING pk"
        ),
        {"token": token, "pks": list(pks), "solo": max_solo_deaths, "killer": KILLER_ERROR},
    )
    return sorted(pk for (pk,) in rows)
