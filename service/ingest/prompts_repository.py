"""Statements about prompts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Text, any_, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.store.models import Prompt
from service.store.queries import array_param

_UPDATABLE = ("dataset", "messages", "reference", "metadata", "reward_spec", "curation_policy")


def _upsert_statement():  # built once: a cached statement executed with many parameter sets
    table = Prompt.__table__
    stmt = insert(table)
    ex = stmt.excluded
    written = (*_UPDATABLE, "reference_from_admin")  # provenance is written, never compared with inline prompts
    changed = func.row(*(table.c[c] for c in written)).is_distinct_from(func.row(*(ex[c] for c in written)))
    return stmt.on_conflict_do_update(
        index_elements=[table.c.id],
        set_={**{c: ex[c] for c in written}, "updated_at": func.now()},
        where=changed,
    )


_UPSERT = _upsert_statement()


# One lock order for prompt rows, everywhere: ascending id by code point -- Python's str order, which is the
# byte order of UTF-8, i.e. ``COLLATE "C"`` in SQL. Never the database's default collation: under en_US /
# ICU ('a' < 'a_1' < 'a-2' < 'A1' < 'B'; Python: 'A1' < 'B' < 'a' < 'a-2' < 'a_1') it differs from
# sorted(), and an upsert (rows sorted here) and a locking SELECT (ordered there) would take the same rows
# in opposite orders. Curation's outcome update locks them FOR UPDATE in id order; an ingest's foreign-key
# checks take KEY SHARE locks on its groups' prompts, and an upsert locks the rows it updates. Taken in
# request order, two such transactions can wait on each other in a cycle (DeadlockDetected "while locking
# tuple ... in relation prompts"); in one order they cannot.


def upsert_prompts(session: Session, rows: list[dict[str, Any]]) -> int:
    """Insert or update prompts by id (rows locked in id order); rows that are unchanged are not rewritten.
    Returns len(rows)."""
    if rows:
        session.execute(_UPSERT, sorted(rows, key=lambda r: r["id"]))
    return len(rows)


def insert_prompts_if_new(session: Session, rows: list[dict[str, Any]]) -> None:
    """Insert prompts whose id is new (in id order); existing prompts are left exactly as they are."""
    if rows:
        session.execute(insert(Prompt.__table__).on_conflict_do_nothing(index_elements=["id"]),
                        sorted(rows, key=lambda r: r["id"]))


def lock_prompts_for_groups(session: Session, ids: Iterable[str]) -> dict[str, str]:
    """prompt id -> dataset for the ids that exist, each row locked FOR KEY SHARE in id order: the lock
    the foreign-key checks of the groups about to be inserted take anyway, taken up front in the one
    order, so inserting groups in request order never holds one prompt while waiting for another."""
    ids = sorted(set(ids))
    if not ids:
        return {}
    stmt = (select(Prompt.id, Prompt.dataset).where(Prompt.id == any_(array_param("ids", ids, Text))).order_by(Prompt.id.collate("C"))
            .with_for_update(read=True, key_share=True))
    return {pid: ds for pid, ds in session.execute(stmt)}


def stored_fields(session: Session, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """prompt id -> its updatable fields as stored (the keys of a prompt row)."""
    cols = [Prompt.__table__.c[c] for c in ("id", *_UPDATABLE)]
    rows = session.execute(select(*cols).where(Prompt.id == any_(array_param("ids", sorted(set(ids)), Text)))).mappings()
    return {r["id"]: {c: r[c] for c in _UPDATABLE} for r in rows}


def get_prompt(session: Session, prompt_id: str) -> Prompt | None:
    return session.get(Prompt, prompt_id)
