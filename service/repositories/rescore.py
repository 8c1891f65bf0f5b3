"""Statements that send stored groups back through scoring or curation."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from service.models import Group, Trajectory

_CLEARED_TRAJECTORY = {"advantage": None, "action": None, "reason": None}


def _filtered(stmt: Any, *, statuses: tuple[str, ...], dataset: str | None, group_ids: list[str] | None,
              policy_version: int | None) -> Any:
    stmt = stmt.where(Group.status.in_(statuses))
    if dataset is not None:
        stmt = stmt.where(Group.dataset == dataset)
    if group_ids is not None:
        stmt = stmt.where(Group.id.in_(group_ids))
    if policy_version is not None:
        stmt = stmt.where(Group.policy_version == policy_version)
    return stmt


def requeue(session: Session, values: dict[str, Any], clear_scores: bool, **filters: Any) -> list[int]:
    """Set ``values`` on the matching groups; reset their trajectories' decisions (and scores). -> pks."""
    stmt = _filtered(update(Group), **filters).values(**values).returning(Group.pk)
    pks = list(session.execute(stmt).scalars())
    if pks:
        cleared = {**_CLEARED_TRAJECTORY, **({"total_reward": None, "outcome": None} if clear_scores else {})}
        session.execute(update(Trajectory).where(Trajectory.group_pk.in_(pks)).values(**cleared))
    return pks
