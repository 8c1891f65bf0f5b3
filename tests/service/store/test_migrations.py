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
