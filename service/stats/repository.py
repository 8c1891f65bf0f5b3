"""Statements of the reward-statistics rollup (table ``stats_cells``) and the facts it is built from."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import delete, select, text, tuple_
from sqlalchemy.orm import Session

from service.store.models import Group, StatsCell

# a group dropped as a whole (untrainable at curation, stale or refused by a trainer later) leaves every
# member out of training, whatever the member's own action said: its members count as drops of its reason.
# :group_drops false reads the facts as they were before such a late drop (to retract them).
_GROUP_DROPPED = (
    "(CAST(:group_drops AS boolean) AND g.status = 'dropped' AND coalesce(t.action, '') NOT IN ('drop', 'resample'))"
)

# one row per trajectory of a curated group, with its components under the spec version its group was
# scored with (two arrays). The hour bucket is taken in UTC and returned as epoch seconds (cheap to decode).
_FACTS = text(
    "SELECT g.pk, t.idx, g.dataset, g.policy_version,"
    " CAST(extract(epoch FROM date_trunc('hour', g.created_at, 'UTC')) AS bigint) AS bucket,"
    " t.finish_reason, t.num_tokens, t.total_reward, t.outcome,"
    f" CASE WHEN {_GROUP_DROPPED} THEN 'drop' ELSE t.action END AS action,"
    f" CASE WHEN {_GROUP_DROPPED} THEN g.drop_reason ELSE t.reason END AS reason, c.names, c.vals,"
    " t.action AS member_action, t.reason AS member_reason, cp.body_hash AS policy_hash"
    " FROM groups g JOIN trajectories t ON t.group_pk = g.pk"
    " LEFT JOIN curation_policies cp ON cp.name = g.curation_policy_name AND cp.version = g.curation_policy_version"
    " LEFT JOIN LATERAL (SELECT array_agg(r.component ORDER BY r.component) AS names,"
    "  array_agg(r.value ORDER BY r.component) AS vals FROM rewards r"
    "  WHERE r.group_pk = t.group_pk AND r.idx = t.idx"
    "  AND r.spec_name = g.reward_spec_name AND r.spec_version = g.reward_spec_version) AS c ON true"
    # the pks on trajectories too: partitions pruned and an index probe per group, whatever the statistics say
    " WHERE g.pk = ANY(CAST(:pks AS bigint[])) AND t.group_pk = ANY(CAST(:pks AS bigint[])) AND g.curated_at IS NOT NULL"
    " ORDER BY g.pk, t.idx"
)

# add counters key by key; keys that sum to 0 (up to float rounding) disappear. Rows are sorted so that two writers lock the
# cells they share in the same order (no deadlock).
_UPSERT = text(
    "INSERT INTO stats_cells AS c (dim, key, dataset, bucket, counters)"
    " SELECT * FROM unnest(CAST(:dims AS text[]), CAST(:keys AS text[]), CAST(:datasets AS text[]),"
    " CAST(:buckets AS timestamptz[]), CAST(CAST(:counters AS text[]) AS jsonb[])) ORDER BY 1, 2, 3, 4"
    " ON CONFLICT (dim, key, dataset, bucket) DO UPDATE SET updated_at = now(),"
    " version = nextval('stats_cells_version_seq'), counters = ("
    "  SELECT coalesce(jsonb_object_agg(k, s), '{}'::jsonb) FROM ("
    "   SELECT k, sum(v) AS s FROM ("
    "    SELECT e.key, e.value::float8 FROM jsonb_each_text(c.counters) AS e"
    "    UNION ALL SELECT e.key, e.value::float8 FROM jsonb_each_text(excluded.counters) AS e) AS u(k, v)"
    "   GROUP BY k HAVING abs(sum(v)) > 1e-12) AS merged)"
)


def trajectory_facts(session: Session, group_pks: Sequence[int], group_drops: bool = True) -> list[Any]:
    """(group_pk, idx, dataset, policy_version, hour as epoch seconds, finish_reason, num_tokens, total,
    outcome, action, reason, component names | None, component values | None, the member's own action and
    reason, its group's curation policy's body hash | None) for every trajectory of the curated groups among
    ``group_pks`` (a value is None where the component failed). A member of a dropped group reads as action
    'drop' with the group's drop reason, unless ``group_drops`` is False."""
    if not group_pks:
        return []
    return list(session.execute(_FACTS, {"pks": list(group_pks), "group_drops": group_drops}))


def policy_bodies(session: Session, hashes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Curation policy bodies by their hash (a body hash names one body, in any database)."""
    if not hashes:
        return {}
    rows = session.execute(text("SELECT DISTINCT ON (body_hash) body_hash, body FROM curation_policies"
                                " WHERE body_hash = ANY(CAST(:hashes AS text[]))"), {"hashes": list(hashes)})
    return {h: body for h, body in rows}


def add_to_cells(session: Session, cells: dict[tuple[str, str, str, datetime], dict[str, float]]) -> None:
    """Add ``counters`` to each cell (created when missing)."""
    if not cells:
        return
    keys = sorted(cells)
    session.execute(
        _UPSERT,
        {
            "dims": [k[0] for k in keys],
            "keys": [k[1] for k in keys],
            "datasets": [k[2] for k in keys],
            "buckets": [k[3] for k in keys],
            "counters": [orjson.dumps(cells[k]).decode() for k in keys],
        },
    )


def lock_cells(session: Session) -> None:
    """Block every other writer of the rollup until this transaction ends (a rebuild)."""
    session.execute(text("LOCK TABLE stats_cells IN EXCLUSIVE MODE"))


def delete_cells(session: Session) -> None:
    session.execute(delete(StatsCell))


def curated_group_pks(session: Session, after_pk: int, limit: int) -> list[int]:
    """The next ``limit`` curated group pks above ``after_pk``, ascending (for a rebuild in chunks)."""
    stmt = (
        select(Group.pk)
        .where(Group.pk > after_pk, Group.curated_at.is_not(None))
        .order_by(Group.pk)
        .limit(limit)
    )
    return list(session.execute(stmt).scalars())


def _scope(
    stmt: Any, dim: str, dataset: str | None, since: datetime | None, all_time: datetime, per_dataset: bool
) -> Any:
    """The cells of ``dim`` a query reads. With ``since``: the hourly cells from that hour on (of
    ``dataset`` if given). Without: the all-time cells (bucket ``all_time``) of ``dataset``, else of every
    dataset (``per_dataset``), else the all-datasets cells (dataset '')."""
    stmt = stmt.where(StatsCell.dim == dim)
    if since is not None:
        stmt = stmt.where(StatsCell.bucket >= since)
        return stmt if dataset is None else stmt.where(StatsCell.dataset == dataset)
    stmt = stmt.where(StatsCell.bucket == all_time)
    if dataset is None and per_dataset:
        return stmt.where(StatsCell.dataset != "")
    return stmt.where(StatsCell.dataset == (dataset or ""))


def read_cells(
    session: Session,
    dim: str,
    dataset: str | None,
    since: datetime | None,
    all_time: datetime,
    per_dataset: bool,
) -> list[Any]:
    """(key, dataset, counters) of the cells a query reads (see ``_scope``)."""
    stmt = select(StatsCell.key, StatsCell.dataset, StatsCell.counters)
    return list(session.execute(_scope(stmt, dim, dataset, since, all_time, per_dataset)))


def cell_versions(
    session: Session, dim: str, dataset: str | None, all_time: datetime, per_dataset: bool
) -> list[Any]:
    """(key, dataset, version) of the all-time cells a query reads; the counters stay in the table."""
    stmt = select(StatsCell.key, StatsCell.dataset, StatsCell.version)
    return list(session.execute(_scope(stmt, dim, dataset, None, all_time, per_dataset)))


def cells_at(session: Session, dim: str, cells: Sequence[tuple[str, str]], bucket: datetime) -> list[Any]:
    """(key, dataset, version, counters) of the named cells of ``dim`` in ``bucket``."""
    if not cells:
        return []
    stmt = select(StatsCell.key, StatsCell.dataset, StatsCell.version, StatsCell.counters).where(
        StatsCell.dim == dim,
        StatsCell.bucket == bucket,
        tuple_(StatsCell.key, StatsCell.dataset).in_(list(cells)),
    )
    return list(session.execute(stmt))


# the remedy steps (decision rows ``remedy_*``, service.curation.remedies) counted per group dataset, UTC hour of
# the step (epoch seconds), remedy and step; of the groups ``:pks``, or of every stored group when it is NULL
_REMEDY_FACTS = text(
    "SELECT g.dataset, CAST(extract(epoch FROM date_trunc('hour', d.created_at, 'UTC')) AS bigint) AS bucket,"
    " d.action, d.rule, count(*) FROM decisions d JOIN groups g ON g.pk = d.group_pk"
    " WHERE (CAST(:pks AS bigint[]) IS NULL OR (d.group_pk = ANY(CAST(:pks AS bigint[]))"
    " AND g.pk = ANY(CAST(:pks AS bigint[])))) AND d.rule LIKE 'remedy\\_%'"
    " GROUP BY 1, 2, 3, 4"
)


def remedy_facts(session: Session, group_pks: Sequence[int] | None) -> list[tuple[str, int, str, str, int]]:
    """(dataset, hour as epoch seconds, remedy, rule, steps) of the remedy steps of the groups ``group_pks``
    (all stored groups: None)."""
    if group_pks is not None and not group_pks:
        return []
    params = {"pks": None if group_pks is None else list(group_pks)}
    return [(ds, int(b), a, r, int(n)) for ds, b, a, r, n in session.execute(_REMEDY_FACTS, params)]


def datasets_and_now(session: Session, group_pks: Sequence[int]) -> tuple[dict[int, str], int]:
    """(group pk -> dataset, the UTC hour of this transaction's ``now()`` as epoch seconds): what a decision row
    inserted now (``created_at`` defaults to ``now()``) is counted under."""
    rows = session.execute(text(
        "SELECT g.pk, g.dataset FROM groups g WHERE g.pk = ANY(CAST(:pks AS bigint[]))"), {"pks": list(group_pks)})
    hour = session.execute(text("SELECT CAST(extract(epoch FROM date_trunc('hour', now(), 'UTC')) AS bigint)"))
    return {pk: ds for pk, ds in rows}, int(hour.scalar_one())


# the archived groups' share of the rollup (service.archive): added to like stats_cells, read by a rebuild
_UPSERT_ARCHIVED = text(
    "INSERT INTO stats_archived_cells AS c (dim, key, dataset, bucket, counters)"
    " SELECT * FROM unnest(CAST(:dims AS text[]), CAST(:keys AS text[]), CAST(:datasets AS text[]),"
    " CAST(:buckets AS timestamptz[]), CAST(CAST(:counters AS text[]) AS jsonb[])) ORDER BY 1, 2, 3, 4"
    " ON CONFLICT (dim, key, dataset, bucket) DO UPDATE SET counters = ("
    "  SELECT coalesce(jsonb_object_agg(k, s), '{}'::jsonb) FROM ("
    "   SELECT k, sum(v) AS s FROM ("
    "    SELECT e.key, e.value::float8 FROM jsonb_each_text(c.counters) AS e"
    "    UNION ALL SELECT e.key, e.value::float8 FROM jsonb_each_text(excluded.counters) AS e) AS u(k, v)"
    "   GROUP BY k HAVING abs(sum(v)) > 1e-12) AS merged)"
)


def add_to_archived_cells(session: Session, cells: dict[tuple[str, str, str, datetime], dict[str, float]]) -> None:
    """Add ``counters`` to each archived cell (created when missing)."""
    if not cells:
        return
    keys = sorted(cells)
    session.execute(_UPSERT_ARCHIVED, {
        "dims": [k[0] for k in keys], "keys": [k[1] for k in keys], "datasets": [k[2] for k in keys],
        "buckets": [k[3] for k in keys], "counters": [orjson.dumps(cells[k]).decode() for k in keys],
    })


def archived_cells(session: Session) -> list[Any]:
    """Every archived cell: (dim, key, dataset, bucket, counters); none before migration 0011 (a rebuild run
    by an older migration)."""
    if session.execute(text("SELECT to_regclass('stats_archived_cells')")).scalar_one() is None:
        return []
    return list(session.execute(text("SELECT dim, key, dataset, bucket, counters FROM stats_archived_cells")))
