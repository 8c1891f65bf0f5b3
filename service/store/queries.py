"""SQL expressions more than one domain's statements read the same way (one definition each)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ARRAY, and_, bindparam, func, select
from sqlalchemy.dialects.postgresql import aggregate_order_by

from service.store.models import Group, Reward, Trajectory


def rewards_column() -> Any:
    """Per trajectory, the components of the spec version that scored its group, as a JSON list of
    ``{component, value, error}`` in component order (the export's and the archive's ``rewards``)."""
    r = Reward.__table__
    item = func.jsonb_build_object("component", r.c.component, "value", r.c.value, "error", r.c.error)
    return (
        select(func.coalesce(func.jsonb_agg(aggregate_order_by(item, r.c.component)), func.jsonb("[]")))
        .where(and_(r.c.group_pk == Group.pk, r.c.idx == Trajectory.idx, r.c.spec_name == Group.reward_spec_name,
                    r.c.spec_version == Group.reward_spec_version))
        .scalar_subquery()
    )


def array_param(name: str, values: Sequence[Any], item: Any) -> Any:
    """One array parameter (for ``= ANY(:name)``), not one bind parameter per value: PostgreSQL takes at most
    65,535 parameters per statement, so ``IN (...)`` of a large id list fails where this does not."""
    return bindparam(name, list(values), type_=ARRAY(item))
