"""Statements of the alerts domain: monitor settings, alerts and their transitions, and the window reads
over stored groups / trajectories / rewards that feed the monitors."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import BigInteger, Text, any_, cast, func, insert, select, text, tuple_, update
from sqlalchemy.orm import Session

from service.store.models import (
    Alert,
    AlertCursor,
    AlertTransition,
    Group,
    MonitorSetting,
    PolicyState,
    Reward,
    RewardSpecRow,
    Trajectory,
)
from service.store.queries import array_param

OPEN_STATES = ("warning", "critical")
_EVALUATE_LOCK_KEY = 0x67616C657274  # "galert": one evaluation (or resolve) at a time


def lock_alerts(session: Session) -> None:
    """Transaction-scoped advisory lock: the worker's schedule and an on-demand evaluation never both open
    the same alert (released at commit / rollback)."""
    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _EVALUATE_LOCK_KEY})


def settings_rows(session: Session) -> list[MonitorSetting]:
    return list(session.execute(select(MonitorSetting)).scalars())


def upsert_setting(session: Session, monitor: str, scope: str, fields: dict[str, Any]) -> None:
    """Store the given fields of one setting (the others kept; a new row's others inherit: NULL)."""
    row = session.get(MonitorSetting, (monitor, scope))
    if row is None:
        session.add(MonitorSetting(monitor=monitor, scope=scope, **fields))
    else:
        for name, value in fields.items():
            setattr(row, name, value)
        row.updated_at = func.now()
    session.flush()


def delete_setting(session: Session, monitor: str, scope: str) -> bool:
    row = session.get(MonitorSetting, (monitor, scope))
    if row is None:
        return False
    session.delete(row)
    session.flush()
    return True


def open_alerts(session: Session) -> list[Alert]:
    """Alerts in warning / critical, locked (one evaluator at a time moves them)."""
    stmt = select(Alert).where(Alert.state.in_(OPEN_STATES)).with_for_update()
    return list(session.execute(stmt).scalars())


def critical_alerts(session: Session) -> list[Alert]:
    stmt = select(Alert).where(Alert.state == "critical").order_by(Alert.since)
    return list(session.execute(stmt).scalars())


def last_resolved_versions(session: Session) -> dict[tuple[str, str | None], int]:
    stmt = (
        select(Alert.monitor, Alert.dataset, func.max(Alert.version))
        .where(Alert.state == "resolved")
        .group_by(Alert.monitor, Alert.dataset)
    )
    return {(m, d): int(v) for m, d, v in session.execute(stmt)}


def get_alert(session: Session, alert_id: str, lock: bool = False) -> Alert | None:
    stmt = select(Alert).where(Alert.id == alert_id)
    return session.execute(stmt.with_for_update() if lock else stmt).scalar_one_or_none()


def list_alerts(session: Session, dataset: str | None, state: str | None, monitor: str | None, limit: int,
                datasets: Sequence[str] | None = None) -> list[Alert]:
    """``datasets``: a scoped key's datasets; only their alerts and the overall ones (dataset null)."""
    stmt = select(Alert)
    if datasets is not None:
        stmt = stmt.where(Alert.dataset.is_(None) | Alert.dataset.in_(list(datasets)))
    if dataset is not None:
        stmt = stmt.where(Alert.dataset == dataset)
    if state is not None:
        stmt = stmt.where(Alert.state == state)
    if monitor is not None:
        stmt = stmt.where(Alert.monitor == monitor)
    return list(session.execute(stmt.order_by(Alert.created_at.desc(), Alert.id).limit(limit)).scalars())


def add_alert(session: Session, alert: Alert) -> None:
    session.add(alert)
    session.flush()


def add_transition(session: Session, **row: Any) -> int:
    t = AlertTransition(**row)
    session.add(t)
    session.flush()
    return t.pk


def transitions(session: Session, alert_id: str) -> list[AlertTransition]:
    stmt = select(AlertTransition).where(AlertTransition.alert_id == alert_id).order_by(AlertTransition.pk)
    return list(session.execute(stmt).scalars())


def window_groups(session: Session, lo: int, hi: int) -> list[Any]:
    """Groups sampled at versions lo..hi (inclusive): the columns the monitors read, in pk order (the same
    groups read in the same order each time: a version's stats are then taken from the StatsCache)."""
    stmt = select(
        Group.pk, Group.dataset, Group.policy_version, Group.status, Group.drop_reason, Group.metric_std,
        Group.reward_spec_name, Group.reward_spec_version, Group.scored_at,
    ).where(Group.policy_version.between(lo, hi)).order_by(Group.pk)
    return list(session.execute(stmt))


def _spec_digest() -> Any:
    return func.sha256(func.convert_to(cast(RewardSpecRow.body, Text), "UTF8"))


def spec_digests(session: Session, keys: Collection[tuple[str, int]]) -> dict[tuple[str, int], bytes]:
    """(name, version) -> sha256 of the stored body, for these spec versions only (absent: no such row)."""
    if not keys:
        return {}
    stmt = select(RewardSpecRow.name, RewardSpecRow.version, _spec_digest()).where(
        tuple_(RewardSpecRow.name, RewardSpecRow.version).in_(sorted(keys)))
    return {(n, int(v)): d for n, v, d in session.execute(stmt)}


def spec_bodies(session: Session, keys: Collection[tuple[str, int]]) -> dict[tuple[str, int], tuple[Any, bytes]]:
    """(name, version) -> (stored body, its sha256), read together in one statement: the digest is always the
    one of the body it came with (absent: no such row)."""
    if not keys:
        return {}
    stmt = select(RewardSpecRow.name, RewardSpecRow.version, RewardSpecRow.body, _spec_digest()).where(
        tuple_(RewardSpecRow.name, RewardSpecRow.version).in_(sorted(keys)))
    return {(n, int(v)): (b, d) for n, v, b, d in session.execute(stmt)}


def window_trajectories(session: Session, group_pks: Sequence[int], tail_chars: int) -> list[Any]:
    stmt = select(
        Trajectory.group_pk, Trajectory.idx, Trajectory.num_tokens, Trajectory.finish_reason,
        func.right(Trajectory.final_answer, tail_chars).label("tail"), Trajectory.outcome, Trajectory.total_reward,
    ).where(Trajectory.group_pk == any_(array_param("pks", group_pks, BigInteger)))
    return list(session.execute(stmt))


def window_rewards(session: Session, group_pks: Sequence[int]) -> list[Any]:
    stmt = select(Reward.group_pk, Reward.idx, Reward.component, Reward.kind, Reward.value).where(
        Reward.group_pk == any_(array_param("pks", group_pks, BigInteger))
    ).order_by(Reward.group_pk, Reward.pk)  # a trajectory's components in a stable order (summed in it)
    return list(session.execute(stmt))


def window_metrics(session: Session, window_versions: int) -> tuple[int, dict[int, Any]]:
    """(the highest published version, 0 when none was published; version -> the trainer metrics published
    with it, for the ``window_versions`` versions up to that one), in one statement."""
    newest = select(func.coalesce(func.max(PolicyState.version), 0).label("v")).subquery()
    window = PolicyState.version.between(func.greatest(0, newest.c.v - window_versions + 1), newest.c.v)
    stmt = select(newest.c.v, PolicyState.version, PolicyState.metrics).select_from(newest).outerjoin(
        PolicyState, window
    )
    rows = session.execute(stmt).all()  # at least one: the newest version, with no metrics row when none is
    return int(rows[0][0]), {int(v): m for _, v, m in rows if v is not None}


def _cursor(session: Session) -> Any:
    """The cursor's (version, since), or None; read as columns, never as an ORM object the session holds
    (``scored_since`` moves it with a statement such an object would not see)."""
    stmt = select(AlertCursor.version, AlertCursor.since).where(AlertCursor.name == "evaluate")
    return session.execute(stmt).first()


def _since(row: Any, as_of: int) -> int | None:
    return (row.since if as_of == row.version else row.version) if as_of <= row.version else row.version


def peek_scored_since(session: Session, as_of: int) -> int | None:
    """What ``scored_since`` answers now, the cursor left where it is."""
    row = _cursor(session)
    return None if row is None else _since(row, as_of)


def scored_since(session: Session, as_of: int) -> int | None:
    """The version after which an evaluation at ``as_of`` scores new values: the last evaluated version,
    or, evaluating that same version again, the one it started from (the same values, the same result);
    the cursor moves to ``as_of``. None: never evaluated. Moving on is one statement, which answers with
    the version it left; a cursor that stays is read and not written (no row locked)."""
    c = AlertCursor
    move = update(c).where(c.name == "evaluate", c.version < as_of).values(version=as_of, since=c.version)
    moved = session.execute(move.returning(c.since)).first()
    if moved is not None:
        return moved.since
    row = _cursor(session)
    if row is None:
        session.execute(insert(c).values(name="evaluate", version=as_of, since=None))
        return None
    return _since(row, as_of)
