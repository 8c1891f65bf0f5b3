"""Batch delivery: lease ready groups, ack (fenced by the lease id), nack, expire, and show a lease.

- A lease claims whole groups with ``FOR UPDATE SKIP LOCKED`` in delivery order ('oldest' = ingest
  order, 'freshest' = newest policy version first) until the budget (groups, trajectories or tokens)
  is full; only trajectories whose action is keep / penalize (or not yet set) are delivered.
- Every lease attempt first reaps expired leases (their groups go back to 'ready') in its own
  transaction, so the reaping is kept when the attempt leases something; the background worker's
  ``reap_expired`` keeps the rest.
- A retried lease request (same ``request_id``) returns the same batch while the lease is active.
- ``wait_seconds`` long-polls: each attempt is short and, when it finds nothing, its transaction is
  rolled back (nothing was stored); between attempts the request waits in ``service.delivery.ready`` (woken by
  PostgreSQL notifications), holding no lock, snapshot, connection or thread.
- An ack consumes the groups only while every one of them is still held by this lease; otherwise 409
  and nothing changes, so a group is consumed by exactly one acked lease.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from starlette.concurrency import run_in_threadpool

from service.alerts.service import check_leasing, raise_if_paused
from service.api.errors import Conflict, Forbidden, LeaseConflict, NotFound, TooManyWaiters
from service.auth.service import OPEN, Principal
from service.curation import service as curation
from service.delivery import repository as lease_repo
from service.delivery.arrow import BatchColumns
from service.delivery.ready import ReadyHub, Waiter
from service.delivery.schemas import MAX_LEASE_TOKENS, LeaseIn, LeaseState, SizingField
from service.policy.service import current_version
from service.stats import service as stats
from service.store.arrays import TOKEN_DTYPE
from service.store.models import Lease

MAX_CHUNK = 1024
# first guess of budget units per group (trajectories, tokens) before any group was seen
_FIRST_GUESS = {"max_groups": 1, "max_trajectories": 8, "max_tokens": 8 * 1024}
Verdict = Literal["taken", "skipped", "full"]


def _units(kind: SizingField, groups: int, trajectories: int, tokens: int) -> int:
    """What counts against the budget of a lease sized by ``kind``."""
    if kind == "max_groups":
        return groups
    return trajectories if kind == "max_trajectories" else tokens


@dataclass
class Claim:
    """Groups taken so far, in delivery order, and what they add up to."""

    kind: SizingField
    limit: int
    pks: list[int] = field(default_factory=list)
    trajectories: int = 0
    tokens: int = 0
    skipped: int = 0
    seen: int = 0  # ready groups offered (taken, skipped or not fitting)

    def used(self) -> int:
        return _units(self.kind, len(self.pks), self.trajectories, self.tokens)

    def offer(self, pk: int, n: int, tokens: int) -> Verdict:
        """Take a group of ``n`` deliverable trajectories / ``tokens`` token ids if it fits.

        A group with nothing deliverable is skipped. A first group that alone exceeds the budget is
        delivered alone (the trainer splits it into micro-batches): passing it over would leave it ready
        forever when every trainer asks for the same budget. Any later group that does not fit ends the
        batch; a group over the Arrow limit (MAX_LEASE_TOKENS) is never deliverable and is skipped.
        """
        self.seen += 1
        cost = _units(self.kind, 1, n, tokens)
        if n == 0 or (not self.pks and tokens > MAX_LEASE_TOKENS):
            self.skipped += 1
            return "skipped"
        if self.used() + cost > self.limit or self.tokens + tokens > MAX_LEASE_TOKENS:
            if not self.pks:
                self.pks.append(pk)
                self.trajectories += n
                self.tokens += tokens
            return "full"
        self.pks.append(pk)
        self.trajectories += n
        self.tokens += tokens
        return "full" if self.used() >= self.limit else "taken"

    def next_chunk(self) -> int:
        """How many groups to lock next: enough to fill the rest at the average seen so far, plus one."""
        remaining = self.limit - self.used()
        if self.kind == "max_groups":
            return max(1, min(MAX_CHUNK, remaining))
        per_group = self.used() / len(self.pks) if self.pks else _FIRST_GUESS[self.kind]
        return max(1, min(MAX_CHUNK, math.ceil(remaining / max(per_group, 1.0)) + 1))


def claim_groups(
    session: Session, body: LeaseIn, min_version: int | None, datasets: frozenset[str] | None = None
) -> Claim:
    """Lock ready groups chunk by chunk (keyset on the delivery order) until the budget is full;
    ``datasets``: only groups of these (a scoped key's)."""
    kind, limit = body.sizing()
    claim = Claim(kind=kind, limit=limit)
    after: tuple[int, int] | None = None
    while True:
        size = claim.next_chunk()
        rows = lease_repo.lock_ready_groups(
            session, min_version=min_version, order=body.order, after=after, limit=size, datasets=datasets,
            need_logprobs=body.need_logprobs,
        )
        for row in rows:
            if claim.offer(row.pk, int(row.n), int(row.tokens)) == "full":
                return claim
        if len(rows) < size:
            return claim
        after = (rows[-1].policy_version, rows[-1].pk)


def reap_expired(session: Session) -> int:
    """Expire active leases past their deadline and return their groups to 'ready'; returns leases expired.

    Leases another transaction holds (an ack in flight, another reaper) are skipped, never waited on.
    """
    ids = lease_repo.lock_expired_leases(session)
    lease_repo.release_groups(session, ids)
    lease_repo.end_leases(session, ids, "expired")
    return len(ids)


def _stats(body: LeaseIn, policy_version: int, columns: dict[str, list[Any]], **extra: Any) -> dict[str, Any]:
    return {
        "groups": len(set(columns["group_id"])),
        "trajectories": len(columns["index"]),
        "tokens": sum(0 if t is None else len(t) // TOKEN_DTYPE.itemsize for t in columns["token_ids"]),
        "policy_version": policy_version,
        "order": body.order,
        **extra,
    }


def _columns(
    session: Session, lease: Lease, body: LeaseIn, *, replayed: bool, skipped: int = 0
) -> BatchColumns:
    """The lease's groups, in lease order, as per-trajectory columns."""
    position = {pk: i for i, pk in enumerate(lease.group_pks)}
    rows = sorted(lease_repo.batch_rows(session, lease.group_pks), key=lambda r: (position[r.pk], r.idx))
    names: tuple[str, ...] = ("group_id", "prompt_id", "policy_version", "index", "token_ids", "loss_mask")
    names += ("logprobs", "advantage", "total_reward", "temperature", "versions", "finish_reason", "rewards")
    columns: dict[str, list[Any]] = {name: [] for name in names}
    for r in rows:
        values = (r.id, r.prompt_id, r.policy_version, r.idx, r.token_ids, r.loss_mask, r.logprobs)
        more = (r.advantage, r.total_reward, r.temperature, r.versions, r.finish_reason, r.rewards)
        for name, value in zip(names, (*values, *more), strict=True):
            columns[name].append(value)
    stats = _stats(body, lease.policy_version or 0, columns, replayed=replayed, skipped=skipped)
    if any(r.segments is not None for r in rows):
        columns["segment_lengths"] = [None if r.segments is None else [int(s["length"]) for s in r.segments]
                                      for r in rows]
        columns["segment_advantages"] = [None if r.segments is None else r.segment_advantages for r in rows]
        columns["segment_advantage"] = [None if r.segments is None else r.segment_advantage for r in rows]
    return BatchColumns(
        batch_id=lease.id,
        trainer_id=lease.trainer_id,
        expires_at=lease.expires_at.isoformat(),
        stats=stats,
        **columns,
    )


def _replay(session: Session, lease: Lease, body: LeaseIn, key: Principal = OPEN) -> BatchColumns:
    """A retried request_id: the same batch while its lease is active, else 409 (403: another key's)."""
    if not key.is_admin and lease.api_key != key.name:
        raise Forbidden("request_id: belongs to a lease taken with another API key", detail={"batch_id": lease.id})
    if lease.trainer_id != body.trainer_id:
        raise Conflict(
            f"request_id: already used by trainer {lease.trainer_id!r}", detail={"batch_id": lease.id}
        )
    if lease.status != "active":
        raise LeaseConflict(
            f"request_id: its lease {lease.id} is already {lease.status}",
            detail={"batch_id": lease.id, "status": lease.status},
        )
    return _columns(session, lease, body, replayed=True)


@dataclass
class Outcome:
    """What an attempt proved. ``nothing_ready``: it saw no ready group at all through no filter of its
    own (no ``max_staleness``, no dataset scope, nothing passed over for its budget or ``min_groups``),
    so no other request could have leased anything either. Only such an attempt may end a wake-up
    chain or let later polls skip their query (``service.delivery.ready``)."""

    nothing_ready: bool = False


def lease_once(
    session: Session,
    body: LeaseIn,
    lease_seconds: float,
    final: bool = True,
    key: Principal = OPEN,
    outcome: Outcome | None = None,
) -> BatchColumns | None:
    """One attempt: reap, replay a known request_id, or claim and record a new lease; None when empty,
    or (before the ``final`` attempt) when fewer than ``min_groups`` groups are ready; ``outcome``
    (filled when given) says whether an empty attempt proves that nothing is ready."""
    reap_expired(session)
    if body.request_id is not None:
        lease_repo.lock_request_id(session, body.request_id)
        existing = lease_repo.lease_by_request_id(session, body.request_id)
        if existing is not None:
            return _replay(session, existing, body, key)  # a retry returns its batch, paused or not
    raise_if_paused(session, key.datasets)  # again: a long poll may wake long after the check in ``lease``
    policy_version = current_version(session)
    min_version = None if body.max_staleness is None else policy_version - body.max_staleness
    claim = claim_groups(session, body, min_version, key.datasets)
    if outcome is not None:
        outcome.nothing_ready = claim.seen == 0 and min_version is None and key.datasets is None
    if not claim.pks or (not final and body.min_groups is not None and len(claim.pks) < body.min_groups):
        return None  # the caller rolls back, releasing the claimed rows
    lease_id = uuid.uuid4().hex
    row = {
        "id": lease_id,
        "trainer_id": body.trainer_id,
        "api_key": key.name,
        "request_id": body.request_id,
        "status": "active",
        "group_pks": claim.pks,
        "n_groups": len(claim.pks),
        "n_trajectories": claim.trajectories,
        "n_tokens": claim.tokens,
        "policy_version": policy_version,
    }
    times = lease_repo.insert_lease(session, row, lease_seconds)
    lease = Lease(**row, created_at=times.created_at, expires_at=times.expires_at)
    return _columns(session, lease, body, replayed=False, skipped=claim.skipped)


async def lease(
    session: Session,
    body: LeaseIn,
    *,
    default_lease_seconds: float,
    disconnected: Callable[[], Awaitable[bool]],
    hub: ReadyHub,
    retry_after_s: float = 1.0,
    key: Principal = OPEN,
) -> BatchColumns | None:
    """Lease a batch, long-polling up to ``wait_seconds``; None (-> 204) when nothing became ready.
    With ``min_groups`` the poll waits for that many ready groups and, at the deadline, returns the
    partial batch there is (a filtered stream that cannot be refilled in time is not an error).

    One attempt now (skipped when the hub knows nothing became ready since an attempt like it found
    nothing); when it finds nothing the transaction is rolled back (it stored nothing) and the
    request waits in ``hub`` (service.delivery.ready) holding no connection and no thread, until a
    notification's wake-up reaches it. 429 when the process already has ``hub.max_waiters`` waiting.
    A client that went away is not leased for.
    """
    lease_seconds = body.lease_seconds or default_lease_seconds
    deadline = time.monotonic() + body.wait_seconds
    filtered = body.max_staleness is not None or body.min_groups is not None or body.need_logprobs

    def attempt_now() -> bool:
        return body.wait_seconds <= 0 or filtered or body.request_id is not None or not hub.nothing_ready()

    # 503 while a pause_leases alert is critical. An attempt checks it itself (``lease_once``, and before a
    # max_staleness drop: ``_attempt_sync``; a retried request_id may replay its batch, paused or not), so the
    # check runs here only before a wait that starts without an attempt
    if body.request_id is None and not attempt_now():
        await run_in_threadpool(check_leasing, session, key.datasets)
    if attempt_now():
        generation = hub.generation
        outcome = Outcome()
        batch = await _attempt(session, body, lease_seconds, body.wait_seconds <= 0, hub, key, outcome)
        if batch is not None or body.wait_seconds <= 0:
            return batch
        if outcome.nothing_ready:
            hub.found_nothing(generation)
        else:
            hub.maybe_ready()
    waiter = hub.admit(filtered=filtered)
    if waiter is None:
        raise TooManyWaiters(
            f"wait_seconds: {hub.max_waiters} lease requests already wait in this process; retry later",
            retry_after_s=retry_after_s,
        )
    try:
        return await _wait_for_batch(session, body, lease_seconds, deadline, disconnected, hub, waiter, key)
    finally:
        hub.leave(waiter)


def _attempt_sync(
    session: Session, body: LeaseIn, lease_seconds: float, final: bool, key: Principal, outcome: Outcome
) -> BatchColumns | None:
    replay = body.request_id is not None and lease_repo.lease_by_request_id(session, body.request_id) is not None
    if body.max_staleness is not None and not replay:  # a replay answers its batch: it drops nothing
        raise_if_paused(session, key.datasets)  # a lease refused while paused drops nothing either
        if drop_stale(session, body.max_staleness, key.datasets):
            session.commit()  # dropped for good, whether or not this attempt finds a batch
    batch = lease_once(session, body, lease_seconds, final, key, outcome)
    if batch is None:
        session.rollback()  # in the same thread: a connection never waits for a free thread to go back
    return batch


async def _attempt(
    session: Session,
    body: LeaseIn,
    lease_seconds: float,
    final: bool,
    hub: ReadyHub,
    key: Principal,
    outcome: Outcome,
) -> BatchColumns | None:
    """One ``lease_once`` in a worker thread, at most ``hub.attempt_slots`` at once per process (the rest
    of the pool stays free for ingest and /healthz); an empty attempt is rolled back."""
    async with hub.attempt_slot():
        return await run_in_threadpool(_attempt_sync, session, body, lease_seconds, final, key, outcome)


async def _wait_for_batch(
    session: Session,
    body: LeaseIn,
    lease_seconds: float,
    deadline: float,
    disconnected: Callable[[], Awaitable[bool]],
    hub: ReadyHub,
    waiter: Waiter,
    key: Principal,
) -> BatchColumns | None:
    """Sleep until woken, try, repeat until the deadline. The wake-up goes on to the next waiter unless
    this attempt proved that nothing is ready (``Outcome``): after a batch, after an attempt whose own
    filters or budget passed ready groups over, after an error or a client gone."""
    while True:
        woken = await hub.wait(waiter, deadline - time.monotonic())
        if await disconnected():
            if woken:
                hub.pass_on(waiter)
            return None
        outcome = Outcome()
        if not woken:  # the deadline: a min_groups lease takes the partial batch there is
            if not body.min_groups:
                return None
            return await _attempt(session, body, lease_seconds, True, hub, key, outcome)
        try:
            batch = await _attempt(session, body, lease_seconds, time.monotonic() >= deadline, hub, key, outcome)
        except BaseException:
            hub.pass_on(waiter)
            raise
        if batch is not None or not outcome.nothing_ready:
            hub.maybe_ready()
            hub.pass_on(waiter)
        if batch is not None or time.monotonic() >= deadline:
            return batch


def _state(session: Session, lease: Lease) -> LeaseState:
    ids = lease_repo.group_ids(session, lease.group_pks)
    overdue = lease.status == "active" and lease.expires_at < lease_repo.db_now(session)
    return LeaseState(
        batch_id=lease.id,
        trainer_id=lease.trainer_id,
        request_id=lease.request_id,
        status=lease.status,  # type: ignore[arg-type]
        deadline_passed=overdue,
        groups=[ids[pk] for pk in lease.group_pks if pk in ids],
        n_groups=lease.n_groups,
        n_trajectories=lease.n_trajectories,
        n_tokens=lease.n_tokens,
        policy_version=lease.policy_version,
        created_at=lease.created_at.isoformat(),
        expires_at=lease.expires_at.isoformat(),
        ended_at=None if lease.ended_at is None else lease.ended_at.isoformat(),
    )


def _ended(lease: Lease, status: str, ended_at: datetime | None) -> None:
    """Reflect what ``end_lease`` stored on the loaded object, without making it dirty."""
    set_committed_value(lease, "status", status)
    set_committed_value(lease, "ended_at", ended_at)


def _locked(session: Session, batch_id: str, key: Principal) -> Lease:
    lease = lease_repo.get_lease(session, batch_id, for_update=True)
    if lease is None:
        raise NotFound(f"batch_id: no lease {batch_id!r}")
    if not key.is_admin and lease.api_key != key.name:
        raise Forbidden(f"batch_id: lease {batch_id} was taken with another API key; only that key or an admin ends it")
    return lease


def ack(session: Session, batch_id: str, key: Principal = OPEN) -> LeaseState:
    """Consume the lease's groups (recording staleness); idempotent once acked.

    409 when the lease was nacked or expired, or when any of its groups is no longer held by it.
    """
    lease = _locked(session, batch_id, key)
    if lease.status == "acked":
        return _state(session, lease)
    if lease.status != "active":
        raise LeaseConflict(
            f"batch_id: lease {batch_id} is {lease.status}; its groups went back to the queue, nothing was consumed",
            detail={"batch_id": batch_id, "status": lease.status},
        )
    held = lease_repo.count_held(session, batch_id)
    if held != lease.n_groups:
        raise LeaseConflict(
            f"batch_id: lease {batch_id} holds {held} of its {lease.n_groups} groups; nothing was consumed",
            detail={"batch_id": batch_id, "held": held},
        )
    lease_repo.consume_groups(session, batch_id, current_version(session))
    _ended(lease, "acked", lease_repo.end_lease(session, batch_id, "acked"))
    return _state(session, lease)


def nack(
    session: Session, batch_id: str, reason: str | None = None, drop: bool = False, key: Principal = OPEN,
    vocab_size: int | None = None,
) -> LeaseState:
    """Return the lease's groups to 'ready'; idempotent once nacked; 409 when acked or expired.

    ``reason`` is kept on the lease. ``drop``: the trainer says it cannot use these groups (a poison batch).
    The service does not take its word for it: each group is re-checked, and only one that really is
    untrainable (a trajectory without token ids / loss mask; with the trainer's ``vocab_size``, also a stored
    token id >= vocab_size) leaves the queue ('dropped' / 'untrainable'); the others go back to 'ready'
    like a plain nack, with a 'keep' decision recording the refusal."""
    lease = _locked(session, batch_id, key)
    if lease.status == "active":
        lease_repo.set_reason(session, batch_id, reason)
        if drop:
            dropped, _ = lease_repo.drop_held_groups(session, batch_id, reason or "no reason given",
                                                        curation.untrainable_reason, vocab_size)
            stats.record_late_drops(session, dropped)
    if lease.status == "nacked":
        return _state(session, lease)
    if lease.status != "active":
        raise LeaseConflict(
            f"batch_id: lease {batch_id} is {lease.status}; nothing to return",
            detail={"batch_id": batch_id, "status": lease.status},
        )
    lease_repo.release_groups(session, [batch_id])
    _ended(lease, "nacked", lease_repo.end_lease(session, batch_id, "nacked"))
    return _state(session, lease)


def extend(session: Session, batch_id: str, lease_seconds: float, key: Principal = OPEN) -> LeaseState:
    """Heartbeat: the lease's deadline becomes ``lease_seconds`` from now, while it is active and still
    holds every one of its groups (409 otherwise: it expired and its groups went back or were re-leased)."""
    lease = _locked(session, batch_id, key)
    if lease.status != "active":
        raise LeaseConflict(
            f"batch_id: lease {batch_id} is {lease.status}; it can no longer be extended",
            detail={"batch_id": batch_id, "status": lease.status},
        )
    held = lease_repo.count_held(session, batch_id)
    if held != lease.n_groups:
        raise LeaseConflict(f"batch_id: lease {batch_id} holds {held} of its {lease.n_groups} groups",
                            detail={"batch_id": batch_id, "held": held})
    set_committed_value(lease, "expires_at", lease_repo.extend_lease(session, batch_id, lease_seconds))
    return _state(session, lease)


def drop_stale(
    session: Session, max_staleness: int | None = None, datasets: frozenset[str] | None = None
) -> int:
    """Ready groups past a staleness limit leave the queue ('dropped', 'stale', with a decision): the
    pipeline passes none (each group's curation policy's ``max_staleness``); a lease passes its own, so
    the groups it can never take do not sit in 'ready' -- counted as the producer's backlog -- for ever."""
    pks = lease_repo.drop_stale_ready(session, max_staleness=max_staleness, datasets=datasets)
    stats.record_late_drops(session, pks)  # their members count as dropped ('stale') in the statistics
    return len(pks)


def state(session: Session, batch_id: str, key: Principal = OPEN) -> LeaseState:
    """A lease's state; a dataset-scoped key sees only the leases it took."""
    lease = lease_repo.get_lease(session, batch_id)
    if lease is None:
        raise NotFound(f"batch_id: no lease {batch_id!r}")
    if key.datasets is not None and lease.api_key != key.name:
        raise Forbidden(f"batch_id: lease {batch_id} was taken with another API key")
    return _state(session, lease)
