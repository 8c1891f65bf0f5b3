"""Statements about groups and trajectories (ingest and read)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session, selectinload

from service.models import Decision, Group, Reward, Trajectory


def insert_group_if_new(session: Session, row: dict[str, Any]) -> int | None:
    """INSERT ... ON CONFLICT (id) DO NOTHING; returns the new pk, or None when the id already exists.

    Under concurrent posts of the same id, PostgreSQL makes the losers wait for the winner's commit,
    so exactly one row is ever stored.
    """
    table = Group.__table__
    stmt = pg_insert(table).values(row).on_conflict_do_nothing(index_elements=[table.c.id]).returning(table.c.pk)
    return session.execute(stmt).scalar_one_or_none()


def existing_group(session: Session, group_id: str) -> Row[Any] | None:
    stmt = select(Group.pk, Group.body_hash, Group.status, Group.n_trajectories).where(Group.id == group_id)
    return session.execute(stmt).one_or_none()


def insert_trajectories(session: Session, rows: list[dict[str, Any]]) -> None:
    if rows:
        session.execute(insert(Trajectory.__table__), rows)


def load_group(session: Session, group_id: str) -> Group | None:
    stmt = select(Group).where(Group.id == group_id).options(selectinload(Group.trajectories))
    return session.execute(stmt).scalar_one_or_none()


def rewards_for(session: Session, group_pk: int, spec_name: str, spec_version: int) -> list[Reward]:
    stmt = (
        select(Reward)
        .where(Reward.group_pk == group_pk, Reward.spec_name == spec_name, Reward.spec_version == spec_version)
        .order_by(Reward.idx, Reward.component)
    )
    return list(session.execute(stmt).scalars())


def decisions_for(session: Session, group_pk: int) -> list[Decision]:
    stmt = select(Decision).where(Decision.group_pk == group_pk).order_by(Decision.pk)
    return list(session.execute(stmt).scalars())


def list_groups(
    session: Session,
    *,
    dataset: str | None,
    status: str | None,
    policy_version: int | None,
    after_pk: int | None,
    limit: int,
) -> list[Group]:
    """Keyset pagination by pk (stable under concurrent inserts)."""
    stmt = select(Group).order_by(Group.pk).limit(limit)
    if dataset is not None:
        stmt = stmt.where(Group.dataset == dataset)
    if status is not None:
        stmt = stmt.where(Group.status == status)
    if policy_version is not None:
        stmt = stmt.where(Group.policy_version == policy_version)
    if after_pk is not None:
        stmt = stmt.where(Group.pk > after_pk)
    return list(session.execute(stmt).scalars())
