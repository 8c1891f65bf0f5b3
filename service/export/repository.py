"""The export's one statement: stored trajectories with their group and prompt, in (group, index) order,
read through a server-side cursor so memory stays constant in the number of rows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.orm import Session

from service.store.models import Group, Prompt, Reward, Trajectory


def _rewards_column() -> Any:
    """Per trajectory, the components of the spec version that scored its group, as a JSON list."""
    r = Reward.__table__
    item = func.jsonb_build_object("component", r.c.component, "value", r.c.value, "error", r.c.error)
    return (
        select(func.coalesce(func.jsonb_agg(aggregate_order_by(item, r.c.component)), func.jsonb("[]")))
        .where(and_(r.c.group_pk == Group.pk, r.c.idx == Trajectory.idx, r.c.spec_name == Group.reward_spec_name,
                    r.c.spec_version == Group.reward_spec_version))
        .scalar_subquery()
    )


def trajectory_rows(session: Session, *, dataset: str | None, min_policy_version: int | None,
                    max_policy_version: int | None, statuses: list[str], with_rewards: bool,
                    batch_rows: int) -> Iterator[dict[str, Any]]:
    """One dict per trajectory, ordered by group then index, fetched ``batch_rows`` at a time."""
    columns = [
        Group.pk.label("group_pk"), Group.id.label("group_id"), Group.prompt_id, Group.dataset,
        Group.policy_version, Group.status.label("group_status"), Group.reward_spec_name, Group.reward_spec_version,
        Prompt.messages.label("prompt_messages"), Prompt.metadata_.label("prompt_metadata"),
        Trajectory.idx, Trajectory.messages, Trajectory.final_answer, Trajectory.finish_reason,
        Trajectory.num_tokens, Trajectory.num_turns, Trajectory.metadata_.label("metadata"), Trajectory.total_reward,
        Trajectory.outcome, Trajectory.advantage, Trajectory.action, Trajectory.reason,
    ]
    if with_rewards:
        columns.append(_rewards_column().label("rewards"))
    stmt = (
        select(*columns)
        .join(Trajectory, Trajectory.group_pk == Group.pk)
        .join(Prompt, Prompt.id == Group.prompt_id)
        .where(Group.status.in_(statuses))
        .order_by(Group.pk, Trajectory.idx)
    )
    if dataset is not None:
        stmt = stmt.where(Group.dataset == dataset)
    if min_policy_version is not None:
        stmt = stmt.where(Group.policy_version >= min_policy_version)
    if max_policy_version is not None:
        stmt = stmt.where(Group.policy_version <= max_policy_version)
    result = session.execute(stmt.execution_options(yield_per=batch_rows))
    for row in result.mappings():
        yield dict(row)
