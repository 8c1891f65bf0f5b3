"""Every statement of the sessions domain."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import DateTime, Integer, Text, bindparam, func, insert, literal, select, text, true, update
from sqlalchemy.orm import Session, aliased

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


class SlotRow(NamedTuple):
    """What a call's checks read of its session's row (service.sessions.gateway), unlocked."""

    id: str
    secret_hash: str
    dataset: str | None
    group_id: str
    upstream: str
    policy_version: int
    status: str
    finish_reason: str | None
    n_calls: int
    n_tokens: int
    created_at: datetime


@dataclass(frozen=True)
class CallSlot:
    """What a call's checks read, in one round trip: the session's row, the clock (``now()``), its group's first
    session's creation time (the group deadline) and its group's first call's temperature."""

    row: Any  # locked: the ORM row (AgentSession); else a ``SlotRow``
    now: datetime | None  # None: the session as a call of this process left it (no clock read; gateway._known)
    group_started: datetime | None
    made: bool  # whether the group made a call (segment marks are no calls)
    first_temperature: Any  # that call's ``temperature`` (None when it gave none)
    first_call: str | None = None  # which call that is ("<session id>#<index>"; None before any)


def _group_first_call(group_id: Any) -> Any:
    """The first call of group ``group_id`` (an outer column): each of its sessions' first call (one primary-key
    probe a session), the earliest of those; never a sort of every call of the group, nor their requests read
    (only that one's temperature). Its ``temperature``, ``made`` (true) and ``key`` ("<session id>#<index>")."""
    peer, call = aliased(AgentSession), aliased(SessionCall)
    own = (select(call.created_at, call.session_id, call.idx, call.request["temperature"].label("temperature"))
           .where(call.session_id == peer.id, call.kind != SEGMENT_MARK).order_by(call.idx).limit(1).lateral("own"))
    key = func.concat(own.c.session_id, "#", own.c.idx).label("key")
    return (select(own.c.temperature, literal(True).label("made"), key).select_from(peer).join(own, true())
            .where(peer.group_id == group_id).order_by(own.c.created_at, own.c.session_id, own.c.idx).limit(1))


def _call_slot_statement(lock: bool) -> Any:
    peer = aliased(AgentSession)
    started = select(func.min(peer.created_at)).where(peer.group_id == AgentSession.group_id).scalar_subquery()
    first = _group_first_call(AgentSession.group_id).lateral("first")
    # locked (the path that may end the session): the ORM row; else a plain row of the columns the checks read
    session = [AgentSession] if lock else [AgentSession.__table__.c[name] for name in SLOT_COLUMNS]
    stmt = (select(*session, func.now().label("now"), started.label("group_started"), first.c.made,
                   first.c.temperature, first.c.key).outerjoin(first, true())
            .where(AgentSession.id == bindparam("session_id")))
    return stmt.with_for_update(of=AgentSession) if lock else stmt


def _reserve_call_statement() -> Any:
    s, c = AgentSession.__table__, SessionCall.__table__
    peer = s.alias("peer")
    group_started = select(func.min(peer.c.created_at)).where(peer.c.group_id == s.c.group_id).scalar_subquery()
    first = _group_first_call(s.c.group_id)
    first_call = first.with_only_columns(first.selected_columns.key).scalar_subquery()
    at = DateTime(timezone=True)  # (no parameter is named as a column: that would be a value to set)
    as_read = (s.c.id == bindparam("r_session_id"), s.c.status == "open", s.c.n_calls == bindparam("r_idx"),
               s.c.n_tokens == bindparam("seen_tokens", type_=Integer),
               s.c.created_at == bindparam("seen_start", type_=at),
               group_started.is_not_distinct_from(bindparam("seen_group_start", type_=at)),
               # the group's first call (whose temperature the group keeps) still the one the checks saw: a
               # session's first call reserved late may be stored as earlier than calls made meanwhile
               first_call.is_not_distinct_from(bindparam("seen_first_call", type_=Text)),
               func.now() <= bindparam("not_after", type_=at))
    bump = update(s).where(*as_read).values(n_calls=s.c.n_calls + 1).returning(s.c.id).cte("bump")
    # its own transaction (autocommit), a synchronous commit: an asynchronous one saved a WAL flush, but a
    # PostgreSQL crash with the call in flight then lost the placeholder while the answer's statement still
    # counted its tokens, and a later call could take the same index (attack on issue 21)
    values = select(*(bindparam(f"r_{name}", type_=c.c[name].type) for name in RESERVED)).select_from(bump)
    return insert(c).from_select(list(RESERVED), values).returning(c.c.idx)


def _store_answer_statement() -> Any:
    s, c = AgentSession.__table__, SessionCall.__table__
    n_tokens = func.coalesce(bindparam("n_tokens", type_=Integer), s.c.n_tokens)
    opened = (update(s).where(s.c.id == bindparam("a_session_id"), s.c.status == "open",
                              n_tokens < bindparam("max_tokens", type_=Integer))
              .values(n_tokens=n_tokens, misuse=func.coalesce(s.c.misuse, bindparam("session_misuse", type_=Text)))
              .returning(s.c.id, s.c.n_calls, s.c.n_tokens).cte("open_session"))
    return (update(c).where(c.c.session_id == opened.c.id, c.c.idx == bindparam("a_idx"))
            .values({name: bindparam(f"a_{name}", type_=c.c[name].type) for name in ANSWERED})
            .returning(opened.c.n_calls, opened.c.n_tokens))


# what a call's checks read of its session (service.sessions.gateway); a call's placeholder's columns, and
# those its answer sets
SLOT_COLUMNS = SlotRow._fields
RESERVED = ("session_id", "idx", "kind", "request", "upstream", "attempts", "latency_ms")
ANSWERED = ("attempts", "latency_ms", "response", "prompt_ids", "completion_ids", "logprobs", "finish_reason",
            "policy_version", "error", "misuse")
# built once: a call's statements are the same every call, so none is built (nor its cache key) per call
_CALL_SLOT, _CALL_SLOT_LOCKED = _call_slot_statement(lock=False), _call_slot_statement(lock=True)
_RESERVE_CALL, _STORE_ANSWER = _reserve_call_statement(), _store_answer_statement()


def call_slot(db: Session, session_id: str, lock: bool = False) -> CallSlot | None:
    """The session's row (``lock``: locked, ``FOR UPDATE``), with ``now()``, ``group_started_at`` and
    ``group_temperature`` read by the same statement; None for an unknown session."""
    params = {"session_id": session_id}
    # unlocked (a call's reservation): a SlotRow, run on the session's connection without the ORM's work
    found = (db.execute(_CALL_SLOT_LOCKED, params) if lock else db.connection().execute(_CALL_SLOT, params)).first()
    if found is None:
        return None
    row = found[0] if lock else SlotRow(*found[:len(SLOT_COLUMNS)])
    return CallSlot(row, found.now, found.group_started, bool(found.made), found.temperature, found.key)


def reserve_call(db: Session, call: dict[str, Any], slot: CallSlot, not_after: datetime) -> bool:
    """The call's placeholder (``RESERVED``'s columns) inserted and counted on its session (``n_calls`` + 1),
    in one statement, only while the session is as its checks saw it (``slot``: open, with ``call["idx"]`` calls,
    its tokens, its and its group's start, its group's first call) and the database's clock is not past ``not_after``: False, with
    nothing written, when another call, a segment mark, the session's end or its deadline came first. The
    session's ORM row, when loaded, keeps its old ``n_calls``."""
    params = {f"r_{name}": call[name] for name in RESERVED}
    params.update(seen_tokens=slot.row.n_tokens, seen_start=slot.row.created_at, seen_group_start=slot.group_started,
                  seen_first_call=slot.first_call, not_after=not_after)
    return db.connection().execute(_RESERVE_CALL, params).first() is not None


def store_answer(db: Session, session_id: str, idx: int, n_tokens: int | None, misuse: str | None,
                 call: dict[str, Any], max_tokens: int) -> tuple[int, int] | None:
    """The answer of call ``idx`` (``ANSWERED``'s columns) written in one statement, only while its session is
    open with fewer than ``max_tokens`` tokens (``n_tokens``, or as it was when None): the session's row
    first (its ``n_tokens``, its first ``misuse``; locked as the statement runs, as ``finish`` locks it), then
    the call's. The session's calls and tokens as it left them; None when the session is not (nothing is
    written)."""
    params = {f"a_{name}": call[name] for name in ANSWERED}
    params.update(a_session_id=session_id, a_idx=idx, n_tokens=n_tokens, session_misuse=misuse, max_tokens=max_tokens)
    stored = db.connection().execute(_STORE_ANSWER, params).first()
    return None if stored is None else (stored[0], stored[1])


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
