"""The partitioned hot tables (migration 0015): ranges created ahead, and retired by DROP.

trajectories, rewards and decisions are partitioned by RANGE (group_pk), and so is prompt_prefixes (0016: a
group's shared prompt tokens, service.ingest). Each range ``[lo, hi)`` has one
partition per table, ``parts.<table>_p<lo>`` (12 digits at least), and one row in ``partitions`` (its bounds,
when it opened, when it was dropped); ``parts.<table>_default`` catches the rows of a pk no range covers yet,
so an insert never fails.

- **Ahead** (``ensure_ahead``): the worker keeps at least one whole range (``GRPO_CURATOR_PARTITION_GROUPS``
  group pks) beyond the newest group pk. A range is created as a plain table and ATTACHed (which locks the
  parent only SHARE UPDATE EXCLUSIVE, ingest goes on); rows that reached the DEFAULT partition meanwhile (the
  worker was down while ingest ran past the ranges) move into it in the same transaction. A gap wider than one
  range (the worker was down long) becomes one catch-up range, so a pass never creates more than three.
- **Retired** (``retire``): a range whose every pk has been handed out (the newest group pk is at or past
  ``hi - 1``) and that holds no groups row -- each of its groups archived (tombstoned), or never there -- has
  its partitions dropped: one DROP TABLE per table, no DELETE. The archiver deletes only the groups rows of
  what it archives (service.archive), so an archived group's trajectories, rewards and decisions stay until
  then, unreachable: every read goes through a live group's pk. The check runs again after each DROP took
  its locks (every transaction that wrote into the partition has ended), in the transaction that drops, and
  rolls it back when a group turned up. A group whose pk was handed out before the drop but whose rows are
  written only after it (an ingest transaction open across the whole retirement) loses nothing: its rows go
  to the DEFAULT partition, where they are read like any other.

DDL waits at most ``LOCK_TIMEOUT`` for its locks (a long read of the parent holds them): a pass that times
out changes nothing and the next pass tries again. One maintainer at a time (an advisory transaction lock).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

SCHEMA = "parts"
TABLES = ("trajectories", "rewards", "decisions", "prompt_prefixes")
LOCK_TIMEOUT = "2s"
_LOCK_KEY = 0x70617274  # "part"
CHECK_EVERY_S = 5.0  # the worker's pass runs maintenance at most this often


@dataclass
class MaintainResult:
    created: list[tuple[int, int]] = field(default_factory=list)  # (lo, hi) of each range created
    dropped: list[tuple[int, int]] = field(default_factory=list)  # (lo, hi) of each range dropped
    moved: int = 0  # rows moved out of the DEFAULT partitions


def partition_name(table: str, lo: int) -> str:
    return f"{table}_p{lo:012d}"


def _lock(session: Session) -> bool:
    """One maintainer at a time (until this transaction ends); False: another one is at it."""
    return bool(session.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _LOCK_KEY}).scalar())


def newest_pk(session: Session) -> int:
    """The newest group pk handed out: the identity's last value, or a larger stored pk (a row inserted with an
    explicit pk); 0 when none."""
    return int(session.execute(text(
        "SELECT greatest(coalesce(pg_sequence_last_value(pg_get_serial_sequence('groups', 'pk')), 0),"
        " coalesce((SELECT max(pk) FROM groups), 0))")).scalar_one())


def ranges(session: Session, *, live_only: bool = False) -> list[tuple[int, int]]:
    """(lo, hi) of every recorded range (those not dropped with ``live_only``), in pk order."""
    sql = "SELECT lo_pk, hi_pk FROM partitions" + (" WHERE dropped_at IS NULL" if live_only else "")
    return [(int(lo), int(hi)) for lo, hi in session.execute(text(sql + " ORDER BY lo_pk"))]


def _create_one(session: Session, table: str, lo: int, hi: int) -> int:
    """Create range [lo, hi) of ``table`` unless it exists (rows its DEFAULT partition holds in it move in);
    returns how many rows moved. Locks the DEFAULT partition first: no insert lands there between the copy
    and the delete."""
    name, default = f"{SCHEMA}.{partition_name(table, lo)}", f"{SCHEMA}.{table}_default"
    if session.execute(text("SELECT to_regclass(:n)"), {"n": name}).scalar() is not None:
        return 0
    session.execute(text(f"LOCK TABLE {default} IN ACCESS EXCLUSIVE MODE"))  # ATTACH takes it anyway
    session.execute(text(f"CREATE TABLE {name} (LIKE public.{table} INCLUDING DEFAULTS)"))
    where = f"group_pk >= {lo} AND group_pk < {hi}"
    moved = session.execute(text(f"INSERT INTO {name} SELECT * FROM {default} WHERE {where}")).rowcount or 0
    if moved:  # only when ingest ran past the ranges: the rows are few, and they move, not go
        session.execute(text(f"DELETE FROM {default} WHERE {where}"))
    session.execute(text(f"ALTER TABLE public.{table} ATTACH PARTITION {name} FOR VALUES FROM ({lo}) TO ({hi})"))
    return moved


def _create(factory: sessionmaker[Session], lo: int, hi: int) -> int | None:
    """Create range [lo, hi) in every table, one table per transaction (so it never holds one table's locks
    while it waits for another's), and record it with the last; returns the rows moved from DEFAULT, None when
    another maintainer is at it. A range left half created (a failure between two tables) is finished by the
    next pass: the rows of a table without it go to DEFAULT meanwhile, and move in then."""
    moved = 0
    for i, table in enumerate(TABLES):
        with factory.begin() as session:
            if not _lock(session):
                return None
            session.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
            moved += _create_one(session, table, lo, hi)
            if i == len(TABLES) - 1:
                session.execute(text("INSERT INTO partitions (lo_pk, hi_pk) VALUES (:lo, :hi)"
                                     " ON CONFLICT (lo_pk) DO NOTHING"), {"lo": lo, "hi": hi})
    return moved


def _wanted(top: int | None, newest: int, size: int, ahead: int) -> list[tuple[int, int]]:
    """The ranges to create above ``top`` (the highest recorded bound) so that ``ahead`` whole ranges lie
    beyond ``newest``: aligned to ``size``; a gap of more than one range first becomes one catch-up range."""
    if top is None:
        top = (newest // size) * size
    out = []
    base = (newest // size) * size
    if base > top:  # the worker was away while ingest ran on: one range covers the gap
        out.append((top, base))
        top = base
    while top <= newest + ahead * size:
        out.append((top, top + size))
        top += size
    return out


def planned(session: Session, size: int, ahead: int = 1) -> list[tuple[int, int]]:
    """The ranges ``ensure_ahead`` would create now."""
    top = session.execute(text("SELECT max(hi_pk) FROM partitions")).scalar()
    return _wanted(None if top is None else int(top), newest_pk(session), size, ahead)


def ensure_ahead(factory: sessionmaker[Session], size: int, ahead: int = 1) -> MaintainResult:
    """Create the ranges that keep ``ahead`` whole ranges of ``size`` group pks beyond the newest group."""
    result = MaintainResult()
    with factory.begin() as session:
        wanted = planned(session, size, ahead)
    for lo, hi in wanted:
        moved = _create(factory, lo, hi)
        if moved is None:
            break
        result.moved += moved
        result.created.append((lo, hi))
    return result


def mark_opened(session: Session) -> int:
    """Stamp ``opened_at`` on the ranges the newest group pk has reached: the created_at of their first group."""
    return session.execute(text(
        "UPDATE partitions p SET opened_at = coalesce((SELECT g.created_at FROM groups g WHERE g.pk >= p.lo_pk"
        " AND g.pk < p.hi_pk ORDER BY g.pk LIMIT 1), now())"
        " WHERE p.opened_at IS NULL AND greatest(p.lo_pk, 1) <= :newest"),
        {"newest": newest_pk(session)}).rowcount or 0


_RETIRABLE = (
    "SELECT p.lo_pk, p.hi_pk FROM partitions p WHERE p.dropped_at IS NULL AND p.hi_pk - 1 <= :newest"
    " AND NOT EXISTS (SELECT 1 FROM groups g WHERE g.pk >= p.lo_pk AND g.pk < p.hi_pk)"
)


def retirable(session: Session) -> list[tuple[int, int]]:
    """The ranges whose every pk was handed out and that hold no groups row (each group archived, or none)."""
    rows = session.execute(text(_RETIRABLE + " ORDER BY p.lo_pk"), {"newest": newest_pk(session)})
    return [(int(lo), int(hi)) for lo, hi in rows]


def _still_retirable(session: Session, lo: int) -> bool:
    return session.execute(text(_RETIRABLE + " AND p.lo_pk = :lo FOR UPDATE OF p"),
                           {"newest": newest_pk(session), "lo": lo}).first() is not None


def _drop(factory: sessionmaker[Session], lo: int) -> bool:
    """Drop range ``lo``'s partitions, one table per transaction: DROP first (it locks the parent, then the
    partition, ACCESS EXCLUSIVE: every transaction that wrote into it has ended), then the check again, which
    rolls the DROP back when a group of the range turned up meanwhile. One table per transaction, so it never
    holds one table's lock while it waits for another's (no lock cycle with a reader of several). The range
    is marked dropped with its last table; a range left half dropped (a failure between two) is finished by a
    later pass once it is retirable again (DROP ... IF EXISTS)."""
    for i, table in enumerate(TABLES):
        with factory() as session:
            if not _lock(session):
                return False
            session.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
            session.execute(text(f"DROP TABLE IF EXISTS {SCHEMA}.{partition_name(table, lo)}"))
            if not _still_retirable(session, lo):
                session.rollback()  # the DROP with it
                return False
            if i == len(TABLES) - 1:
                session.execute(text("UPDATE partitions SET dropped_at = now() WHERE lo_pk = :lo"), {"lo": lo})
            session.commit()
    return True


def retire(factory: sessionmaker[Session]) -> list[tuple[int, int]]:
    """Drop every retirable range; returns (lo, hi) of those dropped. A range whose locks time out (a long
    read holds them) is left for the next pass."""
    with factory.begin() as session:
        candidates = retirable(session)
    dropped = []
    for lo, hi in candidates:
        try:
            if _drop(factory, lo):
                dropped.append((lo, hi))
        except Exception as exc:  # noqa: BLE001 - a lock timeout, say: the next pass tries again
            log.warning("partition [%d, %d): not dropped this pass (%s)", lo, hi, exc)
    if dropped:
        log.info("partitions: dropped %d range(s): %s", len(dropped), dropped)
    return dropped


def maintain(factory: sessionmaker[Session], size: int, *, ahead: int = 1) -> MaintainResult:
    """One maintenance pass: create ranges ahead (and stamp the opened ones), then retire what can go."""
    result = ensure_ahead(factory, size, ahead)
    with factory.begin() as session:
        mark_opened(session)
    if result.created:
        log.info("partitions: created %s (%d rows moved from DEFAULT)", result.created, result.moved)
    result.dropped = retire(factory)
    return result


class Throttle:
    """Run maintenance at most every ``every_s`` seconds from a worker's pass loop."""

    def __init__(self, every_s: float = CHECK_EVERY_S) -> None:
        self.every_s = every_s
        self._next = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.every_s
        return True
