"""Statements about versioned reward specs and curation policies (both append-only tables) and datasets."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.store.models import CurationPolicyRow, Dataset, RewardSpecRow

VersionedRow = type[RewardSpecRow] | type[CurationPolicyRow]


def latest(session: Session, model: VersionedRow, name: str) -> RewardSpecRow | CurationPolicyRow | None:
    stmt = select(model).where(model.name == name).order_by(model.version.desc()).limit(1)
    return session.execute(stmt).scalar_one_or_none()


def get_version(session: Session, model: VersionedRow, name: str, version: int) -> Any:
    return session.get(model, (name, version))


def add_version(session: Session, model: VersionedRow, name: str, body: dict[str, Any], body_hash: str) -> int:
    """Append version latest+1. The name's rows are locked first so concurrent posts number in order."""
    session.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"{model.__tablename__}:{name}"))))
    current = session.execute(select(func.max(model.version)).where(model.name == name)).scalar_one()
    version = (current or 0) + 1
    session.add(model(name=name, version=version, body=body, body_hash=body_hash))
    session.flush()
    return version


def list_names(session: Session, model: VersionedRow) -> list[tuple[str, int]]:
    stmt = select(model.name, func.max(model.version)).group_by(model.name).order_by(model.name)
    return [(n, v) for n, v in session.execute(stmt)]


def upsert_dataset(session: Session, name: str, reward_spec: str | None, curation_policy: str | None) -> None:
    stmt = insert(Dataset).values(name=name, reward_spec=reward_spec, curation_policy=curation_policy)
    stmt = stmt.on_conflict_do_update(
        index_elements=[Dataset.name],
        set_={"reward_spec": reward_spec, "curation_policy": curation_policy, "updated_at": func.now()},
    )
    session.execute(stmt)


def get_dataset(session: Session, name: str) -> Dataset | None:
    return session.get(Dataset, name)
