"""Statements about API keys (table ``api_keys``)."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, exists, func, select, update
from sqlalchemy.orm import Session

from service.store.models import AgentSession, ApiKey


def any_key(session: Session) -> bool:
    """Whether any key was ever created (revoked ones count: auth stays on)."""
    return bool(session.execute(select(exists().select_from(ApiKey))).scalar())


def get_key(session: Session, key_id: str) -> ApiKey | None:
    return session.get(ApiKey, key_id)


def key_by_name(session: Session, name: str) -> ApiKey | None:
    return session.execute(select(ApiKey).where(ApiKey.name == name)).scalar_one_or_none()


def insert_key(session: Session, row: dict[str, Any]) -> None:
    session.add(ApiKey(**row))
    session.flush()


def list_keys(session: Session) -> list[ApiKey]:
    return list(session.execute(select(ApiKey).order_by(ApiKey.created_at, ApiKey.name)).scalars())


def revoke(session: Session, name: str) -> bool:
    """Mark the named key revoked (once); False when there is no such active key."""
    stmt = (
        update(ApiKey)
        .where(ApiKey.name == name, ApiKey.revoked_at.is_(None))
        .values(revoked_at=func.now())
        .execution_options(synchronize_session=False)
    )
    return bool(cast(CursorResult[Any], session.execute(stmt)).rowcount)


def session_secret(session: Session, session_id: str) -> tuple[str, str | None, str] | None:
    """(sha256 of the secret, dataset, status) of an agent session's key; None for an unknown session."""
    row = session.execute(select(AgentSession.secret_hash, AgentSession.dataset, AgentSession.status)
                          .where(AgentSession.id == session_id)).first()
    return None if row is None else (row[0], row[1], row[2])
