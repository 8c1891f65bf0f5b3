"""Counts for /metrics, /v1/summary and the dashboard (cheap: grouped counts on indexed columns).

``dataset``: only that dataset's rows (None: every dataset)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.store.models import Group, Lease, SamplingRequest


def group_counts(session: Session, dataset: str | None = None) -> dict[str, int]:
    stmt = select(Group.status, func.count()).group_by(Group.status)
    if dataset is not None:
        stmt = stmt.where(Group.dataset == dataset)
    return {s: n for s, n in session.execute(stmt)}


def drop_reasons(session: Session, dataset: str | None = None) -> dict[str, int]:
    stmt = select(Group.drop_reason, func.count()).where(Group.status.in_(("dropped", "reward_error"))).group_by(Group.drop_reason)
    if dataset is not None:
        stmt = stmt.where(Group.dataset == dataset)
    return {r or "unknown": n for r, n in session.execute(stmt)}


def active_leases(session: Session, dataset: str | None = None) -> int:
    if dataset is None:
        return session.scalar(select(func.count()).where(Lease.status == "active")) or 0
    stmt = (
        select(func.count(func.distinct(Lease.id)))
        .join(Group, Group.lease_id == Lease.id)
        .where(Lease.status == "active", Group.dataset == dataset)
    )
    return session.scalar(stmt) or 0


def open_sampling_requests(session: Session, dataset: str | None = None) -> dict[str, int]:
    stmt = select(SamplingRequest.reason, func.count()).where(SamplingRequest.status == "open").group_by(SamplingRequest.reason)
    if dataset is not None:
        stmt = stmt.where(SamplingRequest.dataset == dataset)
    return {r: n for r, n in session.execute(stmt)}
