"""Statements that send stored groups back through scoring or curation."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Text, any_, bindparam, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from service.models import Group, Trajectory

_CLEARED_TRAJECTORY = {"advantage": None, "action": None, "reason": None}


def _array(name: str, values: list[Any], item: Any) -> Any:
    """One array parameter (``= ANY(:name)``), not one bind parameter per value: PostgreSQL takes
    at most 65,535 parameters per statement."""
    return bindparam(name, list(values), type_=ARRAY(item))


def _filtered(stmt: Any, *, statuses: tuple[str, ...], dataset: str | None, group_ids: list[str] | None,
              policy_version: int | None) -> Any:
    stmt = stmt.where(Group.status.in_(statuses))
    if dataset is not None:
        stmt = stmt.where(Group.dataset == dataset)
    if group_ids is not None:
        stmt = stmt.where(Group.id == any_(_array("group_ids", group_ids, Text)))
    if policy_version is not None:
        stmt = stmt.where(Group.policy_version == policy_version)
    return stmt


def lock_matching(session: Session, **filters: Any) -> list[int]:
    """Lock the matching groups (so no worker curates them meanwhile) -> their pks."""
    return list(session.execute(_filtered(select(Group.pk), **filters).with_for_update()).scalars())


def requeue(session: Session, pks: list[int], values: dict[str, Any], clear_scores: bool) -> None:
    """Set ``values`` on the groups; reset their trajectories' decisions (and scores)."""
    if pks:
        session.execute(update(Group).where(Group.pk == any_(_array("pks", pks, BigInteger))).values(**values))
        cleared = {**_CLEARED_TRAJECTORY, **({"total_reward": None, "outcome": None} if clear_scores else {})}
        in_groups = Trajectory.group_pk == any_(_array("pks", pks, BigInteger))
        session.execute(update(Trajectory).where(in_groups).values(**cleared))
