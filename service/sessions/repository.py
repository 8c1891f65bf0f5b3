"""Every statement of the sessions domain."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from service.store.models import AgentSession, Prompt, SessionCall

SEGMENT_MARK = "segment"  # a session_calls row of this kind is the agent's segment mark, not a call


def lock_group(db: Session, group_id: str) -> None:
    """Serialise creates / finishes of one group until the transaction ends (its size, its one ingest)."""
    db.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:g, 21))"), {"g": group_id})


def prompt_dataset(db: Session, prompt_id: str) -> str | None:
    return db.execute(select(Prompt.dataset).where(Prompt.id == prompt_id)).scalar_one_or_none()


def group_sessions(db: Session, group_id: str) -> list[AgentSession]:
    stmt = select(AgentSession).where(AgentSession.group_id == group_id).order_by(AgentSession.created_at, AgentSession.id)
    return list(db.execute(stmt).scalars())


def insert_session(db: Session, row: dict[str, Any]) -> None:
    db.add(AgentSession(**row))
    db.flush()


def get_session(db: Session, session_id: str, lock: bool = False) -> AgentSession | None:
    stmt = select(AgentSession).where(AgentSession.id == session_id)
    return db.execute(stmt.with_for_update() if lock else stmt).scalar_one_or_none()


def insert_call(db: Session, row: dict[str, Any]) -> None:
    db.add(SessionCall(**row))
    db.flush()


def calls(db: Session, session_id: str) -> list[SessionCall]:
    stmt = select(SessionCall).where(SessionCall.session_id == session_id).order_by(SessionCall.idx)
    return list(db.execute(stmt).scalars())


def mark_ingested(db: Session, session_ids: list[str]) -> None:
    db.execute(update(AgentSession).where(AgentSession.id.in_(session_ids)).values(ingested_at=func.now()))


def now(db: Session) -> Any:
    return db.execute(select(func.now())).scalar_one()


def group_exists(db: Session, group_id: str) -> bool:
    from service.store.models import Group

    return db.execute(select(Group.pk).where(Group.id == group_id)).first() is not None


def overdue_groups(db: Session, deadline_s: float) -> list[str]:
    """Groups with sessions not yet ingested whose first session is older than the deadline."""
    stmt = (
        select(AgentSession.group_id)
        .where(AgentSession.ingested_at.is_(None), AgentSession.status != "failed")
        .group_by(AgentSession.group_id)
        .having(func.min(AgentSession.created_at) < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, deadline_s))
    )
    return list(db.execute(stmt).scalars())


def in_flight(db: Session, session_id: str, max_age_s: float) -> int:
    """Calls of the session reserved but not yet answered (``attempts`` 0: no forward has returned) and
    younger than ``max_age_s`` (the call's deadline): an older placeholder is a call whose API process
    died (SIGKILL) mid-forward, in flight no more, so it cannot hold the session open at its call limit."""
    stmt = select(func.count()).select_from(SessionCall).where(
        SessionCall.session_id == session_id, SessionCall.attempts == 0,
        SessionCall.created_at > func.now() - func.make_interval(0, 0, 0, 0, 0, 0, max_age_s))
    return int(db.execute(stmt).scalar_one())


def segment_marks(db: Session, session_id: str) -> int:
    stmt = select(func.count()).select_from(SessionCall).where(SessionCall.session_id == session_id,
                                                               SessionCall.kind == SEGMENT_MARK)
    return int(db.execute(stmt).scalar_one())


def get_call(db: Session, session_id: str, idx: int) -> SessionCall | None:
    return db.get(SessionCall, (session_id, idx))


def group_temperature(db: Session, group_id: str) -> tuple[bool, Any]:
    """(whether the group made a call, the temperature its first call asked for, None when it gave none)."""
    stmt = (select(SessionCall.request["temperature"]).join(AgentSession, AgentSession.id == SessionCall.session_id)
            .where(AgentSession.group_id == group_id, SessionCall.kind != SEGMENT_MARK)
            .order_by(SessionCall.created_at, SessionCall.session_id, SessionCall.idx).limit(1))
    row = db.execute(stmt).first()
    return (False, None) if row is None else (True, row[0])


def group_started_at(db: Session, group_id: str) -> Any:
    return db.execute(select(func.min(AgentSession.created_at)).where(AgentSession.group_id == group_id)).scalar_one()


def answered_texts(db: Session, session_id: str) -> list[str]:
    """The text the model generated in each answered call of the session (chat content or completions text)."""
    out = []
    for c in calls(db, session_id):
        if c.completion_ids is None or c.response is None:
            continue
        content = (c.response.get("message") or {}).get("content")
        out.append(content if isinstance(content, str) else "")
    return out
