"""Statements about published policy versions (table ``policy_versions``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from service.store.models import PolicyState

# one advisory lock serialises publishers, so "strictly increasing" holds under concurrent posts
_PUBLISH_LOCK_KEY = 0x67726F706F6C6963  # "gropolic"


def lock_publishing(session: Session) -> None:
    """Transaction-scoped advisory lock: one publisher at a time (released at commit / rollback)."""
    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PUBLISH_LOCK_KEY})


def current_version(session: Session) -> int:
    """The highest published version, 0 when none was published."""
    return int(session.execute(select(func.coalesce(func.max(PolicyState.version), 0))).scalar_one())


def get_version(session: Session, version: int) -> PolicyState | None:
    return session.get(PolicyState, version)


def latest(session: Session) -> PolicyState | None:
    stmt = select(PolicyState).order_by(PolicyState.version.desc()).limit(1)
    return session.execute(stmt).scalar_one_or_none()


def insert_version(
    session: Session, version: int, metrics: dict[str, Any], publisher_key: str | None = None
) -> PolicyState:
    row = PolicyState(version=version, metrics=metrics, publisher_key=publisher_key)
    session.add(row)
    session.flush()
    session.refresh(row, ["created_at"])
    return row


def history(session: Session, limit: int) -> list[PolicyState]:
    stmt = select(PolicyState).order_by(PolicyState.version.desc()).limit(limit)
    return list(session.execute(stmt).scalars())
