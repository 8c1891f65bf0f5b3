"""The partitioned hot tables (migration 0015, service.store.partitions): trajectories, rewards and decisions
(and prompt_prefixes, 0016) by RANGE (group_pk); ranges created ahead by the worker, a DEFAULT partition for anything past them, retirement
by DROP of a range whose groups are all archived, and the migration converting existing rows both ways."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from service.archive import service as archive
from service.settings import get_settings
from service.store import partitions
from service.store.db import dispose_engine, get_engine, make_sessionmaker
from service.store.migrate import downgrade, upgrade
from service.store.models import Trajectory
from service.worker import pipeline
from tests.helpers import make_group, make_shared_prompt_group

TABLES = partitions.TABLES
MIGRATED = ("trajectories", "rewards", "decisions")  # the tables migration 0015 converts


def _one(engine, sql: str, **params):
    with Session(engine) as s:
        return s.execute(text(sql), params).scalar()


def _rows(engine, sql: str, **params) -> list[tuple]:
    with Session(engine) as s:
        return [tuple(r) for r in s.execute(text(sql), params)]


def _exec(engine, sql: str, **params) -> None:
    with Session(engine) as s, s.begin():
        s.execute(text(sql), params)


def _top(engine) -> int:
    return int(_one(engine, "SELECT max(hi_pk) FROM partitions"))


def _next_pk(engine, pk: int) -> None:
    """The next group posted gets ``pk`` (groups.pk is an identity: a jump, as after many groups)."""
    _exec(engine, "SELECT setval(pg_get_serial_sequence('groups', 'pk'), :v)", v=pk - 1)


def _post(api, *ids: str, shared_prompt: bool = True) -> list[int]:
    """Groups of two; with ``shared_prompt`` their members share 40 prompt tokens (a prompt_prefixes row each)."""
    groups = [make_shared_prompt_group(i, n=2, answers=["42", "7"], policy_version=0, prompt_id="p-1") if shared_prompt
              else make_group(i, answers=["42", "7"]) for i in ids]
    r = api.post("/v1/groups", json={"groups": groups})
    assert r.status_code == 201, r.text
    with Session(get_engine(api.db_url)) as s:
        return [s.execute(text("SELECT pk FROM groups WHERE id = :i"), {"i": i}).scalar_one() for i in ids]


def _where(engine, table: str, group_pk: int) -> set[str]:
    """The partitions holding ``table``'s rows of one group."""
    return {r[0] for r in _rows(engine, f"SELECT DISTINCT tableoid::regclass::text FROM {table} WHERE group_pk = :p",
                                p=group_pk)}


def _exists(engine, name: str) -> bool:
    return _one(engine, "SELECT to_regclass(:n)", n=name) is not None


def _scores(engine, pk: int) -> None:
    """A reward and a decision for trajectory 0 of group ``pk`` (the pipeline writes these; tested elsewhere)."""
    _exec(engine, "INSERT INTO rewards (group_pk, idx, spec_name, spec_version, component, kind, value, details,"
                  " latency_ms) VALUES (:p, 0, 's', 1, 'c', 'verifier.math', 1.0, '{}', 1.0)", p=pk)
    _exec(engine, "INSERT INTO decisions (group_pk, idx, action, rule, reason) VALUES (:p, 0, 'keep', 'r', 'x')", p=pk)


@pytest.fixture
def api(fresh_api, fresh_db):
    fresh_api.db_url = fresh_db
    return fresh_api


def test_migration_makes_ranges_and_a_default_partition(api, fresh_db: str) -> None:
    engine = get_engine(fresh_db)
    ranges = _rows(engine, "SELECT lo_pk, hi_pk, opened_at FROM partitions ORDER BY lo_pk")
    size = ranges[0][1] - ranges[0][0]
    assert [(lo, hi) for lo, hi, _ in ranges] == [(0, size), (size, 2 * size)]  # the current range and one ahead
    assert all(opened is None for *_, opened in ranges)  # no group yet
    for table in TABLES:
        assert _one(engine, "SELECT relkind FROM pg_class WHERE oid = CAST(:t AS regclass)", t=table) == "p"
        children = {r[0] for r in _rows(engine, "SELECT inhrelid::regclass::text FROM pg_inherits"
                                                " WHERE inhparent = CAST(:t AS regclass)", t=table)}
        assert children == {f"parts.{table}_p000000000000", f"parts.{table}_p{size:012d}", f"parts.{table}_default"}
    (pk,) = _post(api, "m-1")
    _scores(engine, pk)
    for table in TABLES:
        assert _where(engine, table, pk) == {f"parts.{table}_p000000000000"}


def test_worker_creates_the_next_range_before_the_current_one_fills(api, fresh_db: str, monkeypatch) -> None:
    engine, factory = get_engine(fresh_db), make_sessionmaker(get_engine(fresh_db))
    top = _top(engine)
    _next_pk(engine, top - 3)
    _post(api, "c-1", "c-2")  # pks top-3, top-2: the last range has 2 pks left
    result = partitions.maintain(factory, 10)
    assert result.created == [(top, top + 10)] and result.moved == 0
    assert all(_exists(engine, f"parts.{partitions.partition_name(t, top)}") for t in TABLES)
    assert partitions.maintain(factory, 10).created == []  # one whole range ahead already
    pks = _post(api, *(f"d-{i}" for i in range(9)))  # top-1 .. top+7: into the new range, none in DEFAULT
    assert pks[-1] == top + 7
    for pk in pks[1:]:
        assert _where(engine, "trajectories", pk) == {f"parts.trajectories_p{top:012d}"}
    # through the worker's maintenance (its pass loop, GRPO_CURATOR_PARTITION_GROUPS)
    monkeypatch.setattr(get_settings(), "partition_groups", 10)
    monkeypatch.setattr(pipeline, "_PARTITIONS", partitions.Throttle(0))
    pipeline._maintain(factory)
    assert _exists(engine, f"parts.trajectories_p{top + 10:012d}")
    assert not _exists(engine, f"parts.trajectories_p{top + 20:012d}")
    # the range's opening time: its first group's
    opened, first = _rows(engine, "SELECT p.opened_at, g.created_at FROM partitions p JOIN groups g ON g.pk = p.lo_pk"
                                  " WHERE p.lo_pk = :lo", lo=top)[0]
    assert opened == first


def test_inserts_past_the_ranges_land_in_default_and_move_into_the_range_made_for_them(api, fresh_db: str) -> None:
    engine, factory = get_engine(fresh_db), make_sessionmaker(get_engine(fresh_db))
    top = _top(engine)
    _next_pk(engine, top + 1000)  # the worker was away while ingest ran on
    pks = _post(api, "x-1", "x-2")  # never fails
    _scores(engine, pks[0])
    for table in TABLES:
        assert _where(engine, table, pks[0]) == {f"parts.{table}_default"}
    before = _rows(engine, "SELECT group_pk, idx, md5(CAST(t AS text)) FROM trajectories t ORDER BY 1, 2")
    r = api.get("/v1/groups/x-1", params={"include_tokens": True})
    assert r.status_code == 200
    result = partitions.maintain(factory, 10)
    # one catch-up range over the gap, the range of the newest group, one ahead
    assert result.created == [(top, top + 1000), (top + 1000, top + 1010), (top + 1010, top + 1020)]
    assert result.moved == 4 + 2 + 1 + 1  # 2 x 2 trajectories, their 2 prompt prefixes, a reward, a decision
    for table in TABLES:
        assert _one(engine, f"SELECT count(*) FROM parts.{table}_default") == 0
        assert _where(engine, table, pks[0]) == {f"parts.{table}_p{top + 1000:012d}"}
    assert _rows(engine, "SELECT group_pk, idx, md5(CAST(t AS text)) FROM trajectories t ORDER BY 1, 2") == before
    assert api.get("/v1/groups/x-1", params={"include_tokens": True}).json() == r.json()


def test_retirement_drops_a_fully_archived_range_and_keeps_one_with_a_live_group(api, fresh_db: str,
                                                                                  tmp_path: Path) -> None:
    engine, factory = get_engine(fresh_db), make_sessionmaker(get_engine(fresh_db))
    assert api.post("/v1/policy", json={"version": 1000, "metrics": {}}).status_code == 201  # past the alert window
    first_ranges = [(lo, hi) for lo, hi in _rows(engine, "SELECT lo_pk, hi_pk FROM partitions ORDER BY lo_pk")]
    top = _top(engine)
    _next_pk(engine, top)
    # the migration's ranges: every pk handed out, none of them a group: dropped (and the next one made)
    assert partitions.maintain(factory, 10).dropped == first_ranges
    assert not any(_exists(engine, f"parts.trajectories_p{lo:012d}") for lo, _ in first_ranges)
    a = _post(api, *(f"a-{i}" for i in range(10)))  # range A = [top, top+10), all of it
    assert a == list(range(top, top + 10))
    partitions.maintain(factory, 10)
    (b,) = _post(api, "b-0")  # range B = [top+10, top+20), one pk used
    _scores(engine, a[0])
    _exec(engine, "UPDATE groups SET status = 'consumed' WHERE pk <> :live", live=a[-1])
    _exec(engine, "UPDATE groups SET status = 'ready' WHERE pk = :live", live=a[-1])
    a_names = [f"parts.{partitions.partition_name(t, top)}" for t in TABLES]

    result = archive.archive(engine, str(tmp_path), timedelta(0))
    assert result.groups == 10  # 9 of A, and B's
    assert all(_exists(engine, n) for n in a_names)  # A keeps its live group, so its partitions stay
    # the archived groups' rows stay in A's partitions (no DELETE), unreachable through the API
    assert _one(engine, f"SELECT count(*) FROM parts.trajectories_p{top:012d}") == 20
    assert _one(engine, f"SELECT count(*) FROM parts.rewards_p{top:012d}") == 1
    r = api.get("/v1/groups/a-0")
    assert r.status_code == 200 and r.json()["status"] == "archived"
    listed = api.get("/v1/groups", params={"limit": 100}).json()["groups"]
    assert [g["id"] for g in listed] == ["a-9"]
    assert len(api.get("/v1/groups/a-9").json()["trajectories"]) == 2  # its own rows only
    assert result.partitions_dropped == 0

    _exec(engine, "UPDATE groups SET status = 'consumed' WHERE pk = :live", live=a[-1])
    result = archive.archive(engine, str(tmp_path), timedelta(0))
    assert result.groups == 1 and result.partitions_dropped == 1
    assert not any(_exists(engine, n) for n in a_names)  # dropped whole
    assert _one(engine, "SELECT dropped_at IS NOT NULL FROM partitions WHERE lo_pk = :lo", lo=top)
    # B: its group is archived, but pks of it are still to come: it stays
    assert _where(engine, "trajectories", b) == {f"parts.trajectories_p{top + 10:012d}"}
    with Session(engine) as s:
        assert partitions.retirable(s) == []
    # every archived group exactly once, in the archive
    assert _one(engine, "SELECT count(*) FROM group_tombstones") == 11
    assert _one(engine, "SELECT count(*) FROM groups") == 0


def test_retirement_skips_a_range_a_group_is_still_in(api, fresh_db: str) -> None:
    engine, factory = get_engine(fresh_db), make_sessionmaker(get_engine(fresh_db))
    top = _top(engine)
    _next_pk(engine, top - 1)
    (pk,) = _post(api, "s-1")  # the last pk of the range before top: the range is all handed out, one group live
    lo = _one(engine, "SELECT lo_pk FROM partitions WHERE hi_pk = :top", top=top)
    assert (lo, top) not in partitions.retire(factory)
    assert _exists(engine, f"parts.trajectories_p{lo:012d}")
    assert _where(engine, "trajectories", pk) == {f"parts.trajectories_p{lo:012d}"}


def test_migration_converts_existing_rows_and_downgrade_restores_them(api, fresh_db: str, monkeypatch) -> None:
    engine = get_engine(fresh_db)
    pks = _post(api, *(f"u-{i}" for i in range(5)), shared_prompt=False)  # stored whole (0016: prefix_len 0)
    assert pks == [1, 2, 3, 4, 5]
    for pk in pks:
        _scores(engine, pk)
    columns = ", ".join(c.name for c in Trajectory.__table__.c if c.name != "prefix_len")  # 0015's columns
    queries = {"trajectories": f"SELECT {columns} FROM trajectories ORDER BY group_pk, idx",
               "rewards": "SELECT * FROM rewards ORDER BY pk", "decisions": "SELECT * FROM decisions ORDER BY pk"}
    before = {t: _rows(engine, q) for t, q in queries.items()}
    _exec(engine, "DELETE FROM groups WHERE pk = 5")  # as the archiver does: its rows stay until a DROP
    kept = {"trajectories": [r for r in before["trajectories"] if r[0] != 5],
            "rewards": [r for r in before["rewards"] if r[1] != 5],
            "decisions": [r for r in before["decisions"] if r[1] != 5]}
    dispose_engine(fresh_db)

    downgrade(fresh_db, "0014_oldest_version")
    engine = get_engine(fresh_db)
    for table in MIGRATED:
        assert _one(engine, "SELECT relkind FROM pg_class WHERE oid = CAST(:t AS regclass)", t=table) == "r"
        assert _one(engine, "SELECT count(*) FROM pg_constraint WHERE contype = 'f'"
                            " AND conrelid = CAST(:t AS regclass)", t=table) == 1
        assert _rows(engine, queries[table]) == kept[table]  # an archived group's leftovers are not kept
    assert _one(engine, "SELECT to_regclass('partitions')") is None
    assert _one(engine, "SELECT count(*) FROM pg_namespace WHERE nspname = 'parts'") == 0
    dispose_engine(fresh_db)

    monkeypatch.setenv("GRPO_CURATOR_PARTITION_GROUPS", "2")
    upgrade(fresh_db)
    engine = get_engine(fresh_db)
    for table in MIGRATED:
        assert _one(engine, "SELECT relkind FROM pg_class WHERE oid = CAST(:t AS regclass)", t=table) == "p"
        assert _rows(engine, queries[table]) == kept[table]
        assert _one(engine, "SELECT count(*) FROM pg_constraint WHERE contype = 'f'"
                            " AND conrelid = CAST(:t AS regclass)", t=table) == 0
    ranges = _rows(engine, "SELECT lo_pk, hi_pk, opened_at IS NOT NULL FROM partitions ORDER BY lo_pk")
    assert ranges == [(0, 2, True), (2, 4, True), (4, 6, True), (6, 8, False)]
    assert _rows(engine, "SELECT p.opened_at = g.created_at FROM partitions p JOIN groups g ON g.pk = 2"
                         " WHERE p.lo_pk = 2") == [(True,)]
    assert _where(engine, "trajectories", 3) == {"parts.trajectories_p000000000002"}
    assert _where(engine, "rewards", 1) == {"parts.rewards_p000000000000"}
    # the identities go on where they stopped; a new group lands in its range
    (pk,) = _post(api, "u-new")
    assert pk == 6
    _scores(engine, pk)
    assert _one(engine, "SELECT min(pk) FROM rewards WHERE group_pk = 6") > max(r[0] for r in before["rewards"])
    assert _where(engine, "decisions", 6) == {"parts.decisions_p000000000006"}
    r = api.get("/v1/groups/u-1")
    assert r.status_code == 200 and len(r.json()["decisions"]) == 1
