"""The schema exists only through Alembic: upgrade from empty, and a full downgrade / upgrade cycle."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect, text

from service.store.migrate import downgrade, upgrade
from service.store.models import Base

TABLES = {t.name for t in Base.metadata.sorted_tables}


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_from_empty_creates_every_model_table(make_db):
    url = make_db(migrate=False)
    assert _tables(url) == set()
    upgrade(url)
    assert _tables(url) == TABLES


def test_downgrade_to_base_and_upgrade_again(make_db):
    url = make_db()
    downgrade(url, "base")
    assert _tables(url) == set()
    upgrade(url)
    assert _tables(url) == TABLES
    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar_one() == 1
    engine.dispose()


def test_models_match_migrations(db_url):
    """autogenerate finds nothing to do: the ORM and the migrations describe the same schema."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    engine = create_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_0016_downgrade_writes_the_prompt_prefixes_back_into_their_members(make_db):
    """Groups stored with their prompt once (0016) are whole again after the downgrade to 0015, bit for bit."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.store import arrays
    from tests.helpers import make_group, make_shared_prompt_group

    url = make_db()
    posted = [make_shared_prompt_group("m-shared", prompt_id="p-1"), make_group("m-plain", prompt_id="p-2")]
    posted[0]["trajectories"][2]["logprobs"][25] -= 0.5  # the shared prefix: 25 tokens
    with TestClient(create_app(database_url=url)) as client:
        assert client.post("/v1/groups", json={"groups": posted}).status_code == 201
    engine = create_engine(url)
    sql = ("SELECT g.id, t.idx, t.token_ids, t.loss_mask, t.logprobs, t.versions FROM trajectories t"
           " JOIN groups g ON g.pk = t.group_pk ORDER BY g.id, t.idx")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT DISTINCT prefix_len FROM trajectories ORDER BY 1")).scalars().all() == [0, 25]
    engine.dispose()
    downgrade(url, "0015_partitions")
    engine = create_engine(url)
    with engine.connect() as conn:
        stored = {(gid, idx): (bytes(tok), bytes(lm), bytes(lp), None if v is None else bytes(v))
                  for gid, idx, tok, lm, lp, v in conn.execute(text(sql))}
    engine.dispose()
    want = {(g["id"], i): tuple(arrays.encode(t.get(name), dtype) for name, dtype in (
        ("token_ids", arrays.TOKEN_DTYPE), ("loss_mask", arrays.MASK_DTYPE), ("logprobs", arrays.LOGPROB_DTYPE),
        ("versions", arrays.VERSION_DTYPE))) for g in posted for i, t in enumerate(g["trajectories"])}
    assert stored == want
    upgrade(url)
