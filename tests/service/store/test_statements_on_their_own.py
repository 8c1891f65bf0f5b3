"""``statements_on_their_own``: a read's statements run without BEGIN / COMMIT, and the pooled connection goes
back to the next session transactional again (an autocommit left on it would store half of a failed write)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from service.store.db import get_engine, make_sessionmaker, statements_on_their_own


@pytest.fixture
def factory(fresh_db: str):
    engine = get_engine(fresh_db)
    engine.dispose()
    yield make_sessionmaker(engine)


def _in_a_transaction(session) -> bool:
    # now() is the transaction's start: two statements of one transaction see the same now(), two on their own not
    first = session.execute(text("SELECT now()")).scalar_one()
    session.execute(text("SELECT pg_sleep(0.01)"))
    return session.execute(text("SELECT now()")).scalar_one() == first


def test_a_read_runs_each_statement_on_its_own_and_the_next_session_is_transactional_again(factory) -> None:
    with factory() as session:
        statements_on_their_own(session)
        assert not _in_a_transaction(session)
        session.commit()
    # the one pooled connection again: a write that fails is rolled back whole
    with factory() as session:
        assert _in_a_transaction(session)
        session.execute(text("CREATE TABLE half (x int)"))
        session.rollback()
    with factory() as session:
        assert session.execute(text("SELECT to_regclass('half')")).scalar_one() is None
    assert factory.kw["bind"].pool.checkedout() == 0


def test_a_session_in_a_transaction_or_bound_to_a_callers_connection_keeps_it(factory) -> None:
    with factory() as session:
        session.execute(text("SELECT 1"))
        statements_on_their_own(session)  # too late: the transaction stays one
        assert _in_a_transaction(session)
    engine = factory.kw["bind"]
    with engine.connect() as conn:
        outer = conn.begin()
        with factory(bind=conn) as session:
            statements_on_their_own(session)
            assert _in_a_transaction(session)
            session.execute(text("CREATE TABLE kept_out (x int)"))
        outer.rollback()
    with factory() as session:
        assert session.execute(text("SELECT to_regclass('kept_out')")).scalar_one() is None
