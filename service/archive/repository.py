"""The archive's statements: which finished groups are due, their rows as written to Parquet (with a content
fingerprint per row), and the one transaction that re-checks the fingerprints under row locks, records the
files and tombstones and deletes the groups rows (their trajectories, rewards and decisions go with their
partition, service.store.partitions)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

from sqlalchemy import BigInteger, Connection, Text, any_, cast, func, insert, select, text, tuple_
from sqlalchemy.orm import Session

from service.store.models import ArchiveFile, ArchiveIdentity, Group, GroupTombstone, Prompt, Trajectory
from service.store.queries import array_param, rewards_column

FINAL_STATUSES = ("consumed", "dropped", "reward_error", "curation_error")
_LOCK_KEY = 0x61726368  # "arch": one archiver at a time (a session-level advisory lock)


def try_lock(conn: Connection) -> bool:
    """Take the archiver's lock on this connection (held until it is released or the connection ends,
    so a killed archiver leaves none behind); False when another archiver holds it."""
    return bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _LOCK_KEY}).scalar_one())


def unlock(conn: Connection) -> None:
    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _LOCK_KEY})


def identity(session: Session) -> str:
    """This database's archive id (drawn on the first call, and again in a copy or a restore of the database:
    its OID differs from the one the id was drawn in). Call under the archiver's lock."""
    oid = session.execute(text("SELECT oid FROM pg_database WHERE datname = current_database()")).scalar_one()
    row = session.get(ArchiveIdentity, "archive")
    if row is None:
        row = ArchiveIdentity(name="archive", id=uuid.uuid4().hex[:16], database_oid=oid)
        session.add(row)
    elif row.database_oid != oid:
        row.id, row.database_oid = uuid.uuid4().hex[:16], oid
    session.flush()
    return row.id


def _day() -> Any:
    return func.date(func.timezone("UTC", Group.created_at))


def due_groups(session: Session, cutoff: datetime, after_pk: int, limit: int,
               below_version: int) -> list[tuple[int, str, date, str]]:
    """(pk, dataset, UTC day, status) of the next ``limit`` groups above ``after_pk`` in a final status, created
    before ``cutoff`` and sampled at a policy version below ``below_version``, in pk order."""
    stmt = (
        select(Group.pk, Group.dataset, _day(), Group.status)
        .where(Group.pk > after_pk, Group.status.in_(FINAL_STATUSES), Group.created_at < cutoff,
               Group.policy_version < below_version)
        .order_by(Group.pk)
        .limit(limit)
    )
    return [(pk, ds, day, status) for pk, ds, day, status in session.execute(stmt)]


_COLUMNS = (
    Group.pk.label("group_pk"), Group.id.label("group_id"), Group.prompt_id, Group.dataset, Group.policy_version,
    Group.status, Group.drop_reason, Group.created_at, Group.consumed_at, Group.reward_spec_name,
    Group.reward_spec_version, Group.curation_policy_name, Group.curation_policy_version,
    Group.sampling.label("sampling"), Group.metadata_.label("group_metadata"),
    Prompt.messages.label("prompt_messages"), Prompt.metadata_.label("prompt_metadata"),
    Trajectory.idx, Trajectory.messages, Trajectory.final_answer, Trajectory.finish_reason, Trajectory.seq_len,
    Trajectory.num_tokens, Trajectory.num_turns, Trajectory.metadata_.label("metadata"), Trajectory.total_reward,
    Trajectory.outcome, Trajectory.advantage, Trajectory.action, Trajectory.reason, Trajectory.segments,
    Trajectory.segment_advantages, Trajectory.token_ids, Trajectory.loss_mask, Trajectory.logprobs,
    Trajectory.versions,
)
# The prompt stays hot when its groups go (the file keeps a copy): a prompt edited meanwhile loses nothing.
_UNHASHED = ("prompt_messages", "prompt_metadata")


def _content(pks: Sequence[int]) -> tuple[Any, Any]:
    """Every column the archive keeps, one row per trajectory of the groups ``pks``, and ``content_md5``: the
    md5 of the row's text (all but the prompt's columns), computed in the same statement, so it fingerprints
    exactly what was read."""
    sub = (
        select(*_COLUMNS, rewards_column().label("rewards"))
        .join(Trajectory, Trajectory.group_pk == Group.pk)
        .outerjoin(Prompt, Prompt.id == Group.prompt_id)
        # the same pks on trajectories too: their partitions are pruned, and each is probed by its key
        # (joined on group_pk alone, the planner hashes a whole partition of the range)
        .where(Group.pk == any_(array_param("pks", list(pks), BigInteger)),
               Trajectory.group_pk == any_(array_param("pks", list(pks), BigInteger)))
        .subquery("content")
    )
    hashed = tuple_(*(c for c in sub.c if c.name not in _UNHASHED))
    return sub, func.md5(cast(hashed, Text)).label("content_md5")


def group_rows(session: Session, pks: Sequence[int]) -> list[dict[str, Any]]:
    """One dict per trajectory of the groups ``pks`` (group then index order): every column the archive keeps,
    and ``content_md5`` (``content_hashes`` computes the same later)."""
    sub, md5 = _content(pks)
    stmt = select(sub, md5).order_by(sub.c.group_pk, sub.c.idx)
    return [dict(row) for row in session.execute(stmt).mappings()]


def content_hashes(session: Session, pks: Sequence[int]) -> list[tuple[int, str]]:
    """(group pk, ``content_md5``) per trajectory of the groups ``pks`` as they are now (group then index
    order). Lock the groups first (``lock_groups``, ``lock_trajectories``) to keep them so."""
    sub, md5 = _content(pks)
    stmt = select(sub.c.group_pk, md5).order_by(sub.c.group_pk, sub.c.idx)
    return [(pk, h) for pk, h in session.execute(stmt)]


def lock_groups(session: Session, pks: Sequence[int]) -> set[int]:
    """The groups among ``pks`` that still exist, locked FOR UPDATE (pk order): every writer of a group's
    status, scores or decisions (rescore, recurate, the score and curation stages) takes this lock first."""
    stmt = select(Group.pk).where(Group.pk == any_(array_param("pks", list(pks), BigInteger)))
    return set(session.execute(stmt.order_by(Group.pk).with_for_update()).scalars())


def lock_trajectories(session: Session, pks: Sequence[int]) -> None:
    """Lock the groups' trajectories FOR UPDATE as well (after ``lock_groups``): no write of theirs lands
    between the fingerprint check and the delete."""
    stmt = select(Trajectory.group_pk).where(Trajectory.group_pk == any_(array_param("pks", list(pks), BigInteger)))
    session.execute(stmt.order_by(Trajectory.group_pk, Trajectory.idx).with_for_update())


def insert_file(session: Session, row: dict[str, Any]) -> int:
    """Record one written file (re-recording the same location is a conflict: it names one content)."""
    return session.execute(insert(ArchiveFile).values(**row).returning(ArchiveFile.pk)).scalar_one()


def insert_tombstones(session: Session, pks: Sequence[int], file_pk: int) -> None:
    g = Group.__table__
    cols = ("id", "pk", "body_hash", "prompt_id", "dataset", "policy_version", "status", "drop_reason",
            "n_trajectories")
    source = select(*(g.c[c] for c in cols), g.c.created_at, func.cast(file_pk, Group.pk.type)).where(
        g.c.pk.in_(list(pks)))
    session.execute(insert(GroupTombstone).from_select([*cols, "group_created_at", "file_pk"], source))


def delete_groups(session: Session, pks: Sequence[int]) -> int:
    """Delete the groups rows, and only those: their trajectories, rewards and decisions (the bytes) stay in
    their partitions, unreachable (every read goes through a live group), until the partition is dropped whole
    (``service.store.partitions.retire``): no bulk DELETE of the large rows."""
    return session.execute(Group.__table__.delete().where(Group.__table__.c.pk.in_(list(pks)))).rowcount


def recorded_locations(session: Session) -> set[str]:
    return set(session.execute(select(ArchiveFile.location)).scalars())


def tombstone(session: Session, group_id: str) -> Any:
    """(tombstone row, its file's location) of an archived group, or None."""
    stmt = (select(GroupTombstone, ArchiveFile.location)
            .join(ArchiveFile, ArchiveFile.pk == GroupTombstone.file_pk).where(GroupTombstone.id == group_id))
    return session.execute(stmt).one_or_none()


def files(session: Session, kind: str, dataset: str | None) -> list[ArchiveFile]:
    """The recorded files of ``kind`` (one dataset, or all), in the order of their groups."""
    stmt = select(ArchiveFile).where(ArchiveFile.kind == kind).order_by(ArchiveFile.first_pk)
    if dataset is not None:
        stmt = stmt.where(ArchiveFile.dataset == dataset)
    return list(session.execute(stmt).scalars())

