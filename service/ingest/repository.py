"""Statements about groups and trajectories (ingest and read)."""

from __future__ import annotations

import json
from typing import Any

import orjson
from psycopg.types.json import Jsonb
from sqlalchemy import BigInteger, Row, Text, any_, bindparam, exists, func, select, text
from sqlalchemy.orm import Session, selectinload

from service.store import prefix
from service.store.models import Decision, Group, GroupTombstone, Prompt, PromptPrefix, Reward, Trajectory
from service.store.queries import array_param

# one array parameter per column (unnest), not a VALUES row of parameters per group: a fixed statement whatever the
# number of groups, which psycopg parses once (a 50-group VALUES statement was new text to parse on each request:
# ~12 ms of its Python tokenizer, the largest single cost of a request of small groups)
_GROUP_COLUMNS = (("pk", "bigint"), ("id", "text"), ("prompt_id", "text"), ("dataset", "text"),
                  ("policy_version", "int"), ("oldest_version", "int"), ("sampling", "text"), ("metadata", "text"),
                  ("body_hash", "text"), ("producer_key", "text"), ("n_trajectories", "int"), ("n_tokens", "bigint"))
_JSON_COLUMNS = frozenset({"sampling", "metadata"})
_INSERT_GROUPS = text(
    f"INSERT INTO groups ({', '.join(c for c, _ in _GROUP_COLUMNS)}) "
    f"SELECT {', '.join(f'r.{c}::jsonb' if c in _JSON_COLUMNS else f'r.{c}' for c, _ in _GROUP_COLUMNS)} "
    f"FROM unnest({', '.join(f'CAST(:{c} AS {t}[])' for c, t in _GROUP_COLUMNS)}) "
    f"WITH ORDINALITY AS r({', '.join(c for c, _ in _GROUP_COLUMNS)}, ord) ORDER BY r.ord "
    "ON CONFLICT (id) DO NOTHING RETURNING id, pk"
)


_NEXT_PKS = text("SELECT nextval(pg_get_serial_sequence('groups', 'pk')) FROM generate_series(1, :n)")


def insert_groups_if_new(session: Session, rows: list[dict[str, Any]]) -> dict[str, int]:
    """INSERT ... ON CONFLICT (id) DO NOTHING of every row in one statement (the columns as arrays, in the rows'
    order); returns id -> new pk for the rows inserted (an id that already exists is left out).

    The pks are drawn first and given in the rows' order (the queue keeps request order); the rows go in by id
    (Python's str order, one order for every request). Under concurrent posts of the same id PostgreSQL makes
    the losers wait for the winner's commit, so exactly one row is ever stored -- and two requests sharing ids
    wait in one direction: in request order, a batch [a, b] and a batch [b, a] each held one id while
    waiting for the other's (a deadlock, 40P01).
    """
    if not rows:
        return {}
    pks = sorted(session.execute(_NEXT_PKS, {"n": len(rows)}).scalars())
    ordered = sorted(({**row, "pk": pk} for row, pk in zip(rows, pks, strict=True)), key=lambda r: r["id"])
    columns = {c: [orjson.dumps(r[c]).decode() if c in _JSON_COLUMNS else r[c] for r in ordered]
               for c, _ in _GROUP_COLUMNS}
    return {gid: pk for gid, pk in session.execute(_INSERT_GROUPS, columns)}


def existing_groups(session: Session, group_ids: list[str]) -> dict[str, Row[Any]]:
    """id -> (pk, body_hash, status, n_trajectories) of the stored groups among ``group_ids``."""
    if not group_ids:
        return {}
    stmt = (select(Group.id, Group.pk, Group.body_hash, Group.status, Group.n_trajectories)
            .where(Group.id == any_(array_param("ids", group_ids, Text))))
    return {row.id: row for row in session.execute(stmt)}


def tombstones(session: Session, group_ids: list[str]) -> dict[str, Row[Any]]:
    """id -> (id, body_hash, n_trajectories) of the archived groups among ``group_ids``: what answers a re-post
    (``service.archive``'s tombstone, for a whole request in one statement)."""
    if not group_ids:
        return {}
    stmt = (select(GroupTombstone.id, GroupTombstone.body_hash, GroupTombstone.n_trajectories)
            .where(GroupTombstone.id == any_(array_param("ids", group_ids, Text))))
    return {t.id: t for t in session.execute(stmt)}


TRAJECTORY_COLUMNS = (
    "group_pk", "idx", "messages", "final_answer", "token_ids", "loss_mask", "logprobs",
    "seq_len", "num_tokens", "num_turns", "finish_reason", "metadata", "segments", "versions", "prefix_len",
)
_COPY_TYPES = ("int8", "int2", "jsonb", "text", "bytea", "bytea", "bytea", "int4", "int4", "int2", "varchar", "jsonb",
               "jsonb", "bytea", "int4")
_ARRAY_AT = {name: TRAJECTORY_COLUMNS.index(name) for name, _ in prefix.ARRAYS}
_SEGMENTS_AT, _PREFIX_LEN_AT = TRAJECTORY_COLUMNS.index("segments"), TRAJECTORY_COLUMNS.index("prefix_len")
_COPY_SQL = f"COPY trajectories ({', '.join(TRAJECTORY_COLUMNS)}) FROM STDIN (FORMAT BINARY)"


def _json(text: str) -> Jsonb:
    """Already-serialised JSON for a jsonb column (no second encode)."""
    return Jsonb(text, dumps=_identity)


def _identity(text: str) -> str:
    return text


def insert_trajectories(session: Session, rows: list[tuple[Any, ...]]) -> None:
    """Binary COPY inside the session's transaction: rows are tuples in TRAJECTORY_COLUMNS order,
    JSONB columns as already-serialised JSON text. Measured several times faster than executemany."""
    if not rows:
        return
    raw = session.connection().connection.driver_connection
    with raw.cursor() as cur, cur.copy(_COPY_SQL) as copy:
        copy.set_types(_COPY_TYPES)
        for row in rows:
            copy.write_row((*row[:2], _json(row[2]), *row[3:11], _json(row[11]),
                            None if row[12] is None else _json(row[12]), *row[13:]))


def insert_new_groups_trajectories(session: Session, groups: list[tuple[int, list[tuple[Any, ...]]]]) -> None:
    """New groups' members ((group pk, rows as ``insert_trajectories`` takes them, whole, prefix_len 0) each):
    the prefix a group's members all share (``service.store.prefix.split``) goes once into prompt_prefixes and
    each row keeps the rest; a group that shares none worth it is stored as posted. One INSERT of every
    group's prefix and one COPY of every member, whatever the number of groups."""
    prefixes: list[dict[str, Any]] = []
    stored: list[tuple[Any, ...]] = []
    for group_pk, rows in groups:
        cut = prefix.split([{name: row[i] for name, i in _ARRAY_AT.items()} for row in rows],
                           segmented=any(row[_SEGMENTS_AT] is not None for row in rows))
        if cut is None:
            stored.extend(rows)
            continue
        prefixes.append({"group_pk": group_pk, **cut.prefix})
        for row, rest in zip(rows, cut.suffixes, strict=True):
            values = list(row)
            for name, i in _ARRAY_AT.items():
                values[i] = rest[name]
            values[_PREFIX_LEN_AT] = cut.n_tokens
            stored.append(tuple(values))
    if prefixes:
        session.execute(PromptPrefix.__table__.insert(), prefixes)
    insert_trajectories(session, stored)


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
    drop_reason: str | None = None,
    finish_reason: str | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
) -> list[Group]:
    """Keyset pagination by pk (stable under concurrent inserts). ``finish_reason`` / ``min_reward`` /
    ``max_reward``: groups with at least one trajectory that matches all of them."""
    stmt = select(Group).order_by(Group.pk).limit(limit)
    if drop_reason is not None:
        stmt = stmt.where(Group.drop_reason == drop_reason)
    member = [Trajectory.group_pk == Group.pk]
    if finish_reason is not None:
        member.append(Trajectory.finish_reason == finish_reason)
    if min_reward is not None:
        member.append(Trajectory.total_reward >= min_reward)
    if max_reward is not None:
        member.append(Trajectory.total_reward <= max_reward)
    if len(member) > 1:
        stmt = stmt.where(exists().where(*member))
    if dataset is not None:
        stmt = stmt.where(Group.dataset == dataset)
    if status is not None:
        stmt = stmt.where(Group.status == status)
    if policy_version is not None:
        stmt = stmt.where(Group.policy_version == policy_version)
    if after_pk is not None:
        stmt = stmt.where(Group.pk > after_pk)
    return list(session.execute(stmt).scalars())


def mean_rewards(session: Session, group_pks: list[int]) -> dict[int, float | None]:
    """group pk -> the mean total reward of its scored members (None: none scored), for a page of groups."""
    if not group_pks:
        return {}
    stmt = (select(Trajectory.group_pk, func.avg(Trajectory.total_reward))
            .where(Trajectory.group_pk.in_(group_pks)).group_by(Trajectory.group_pk))
    return {pk: (None if mean is None else float(mean)) for pk, mean in session.execute(stmt)}


def prompts_by_id(session: Session, ids: set[str]) -> dict[str, Prompt]:
    return {p.id: p for p in session.execute(select(Prompt).where(Prompt.id == any_(array_param("ids", sorted(ids), Text)))).scalars()}


def update_groups(session: Session, rows: list[dict[str, Any]]) -> None:
    """Bulk UPDATE by primary key; every row has the same keys (``pk`` plus the columns to set)."""
    if rows:
        stmt = Group.__table__.update().where(Group.__table__.c.pk == bindparam("_pk"))
        session.execute(stmt, [_rename_pk(r) for r in rows])


def _rename_pk(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k != "pk"}
    out["_pk"] = row["pk"]
    return out


def lock_group(session: Session, group_id: str) -> Group | None:
    """The group row, locked FOR UPDATE (a fill and the deadline pass take it one at a time), with its
    trajectories."""
    stmt = (select(Group).where(Group.id == group_id).with_for_update(of=Group)
            .options(selectinload(Group.trajectories)))
    return session.execute(stmt).scalar_one_or_none()


def replace_trajectory(session: Session, row: tuple[Any, ...]) -> None:
    """Overwrite one stored trajectory (a row in TRAJECTORY_COLUMNS order) and forget its rewards, scores
    and decision: the group is scored and curated again with it."""
    values = dict(zip(TRAJECTORY_COLUMNS, row, strict=True))
    pk, idx = values.pop("group_pk"), values.pop("idx")
    values["messages"] = json.loads(values["messages"])  # the ORM column encodes JSONB itself
    values["metadata"] = json.loads(values["metadata"])
    if values["segments"] is not None:  # the same JSON text POST /v1/groups copies in, decoded for the ORM column
        values["segments"] = json.loads(values["segments"])
    values |= {"total_reward": None, "outcome": None, "advantage": None, "action": None, "reason": None}
    session.execute(
        Trajectory.__table__.update()
        .where(Trajectory.__table__.c.group_pk == pk, Trajectory.__table__.c.idx == idx)
        .values(**values)
    )
    session.execute(Reward.__table__.delete().where(Reward.group_pk == pk, Reward.idx == idx))


def delete_groups(session: Session, pks: list[int]) -> None:
    """Take back group rows this transaction just inserted (their ids turned out to be archived)."""
    if pks:
        session.execute(Group.__table__.delete().where(Group.__table__.c.pk == any_(array_param("pks", pks, BigInteger))))
