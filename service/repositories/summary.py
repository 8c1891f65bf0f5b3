"""Counts for /metrics, /v1/summary and the dashboard (cheap: grouped counts on indexed columns)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Group, Lease, SamplingRequest


def group_counts(session: Session) -> dict[str, int]:
    return {s: n for s, n in session.execute(select(Group.status, func.count()).group_by(Group.status))}


def drop_reasons(session: Session) -> dict[str, int]:
    stmt = select(Group.drop_reason, func.count()).where(Group.status.in_(("dropped", "reward_error"))).group_by(Group.drop_reason)
    return {r or "unknown": n for r, n in session.execute(stmt)}


def active_leases(session: Session) -> int:
    return session.scalar(select(func.count()).where(Lease.status == "active")) or 0


def open_sampling_requests(session: Session) -> dict[str, int]:
    stmt = select(SamplingRequest.reason, func.count()).where(SamplingRequest.status == "open").group_by(SamplingRequest.reason)
    return {r: n for r, n in session.execute(stmt)}
