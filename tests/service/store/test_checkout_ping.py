"""A pooled connection is pinged at checkout only when it may have died unseen (service.store.db.PING_IDLE_S):
one back from a request a moment ago is taken as it is, one whose backend ended (its socket reads the end) or
one idle past the bound is pinged, and a dead one is replaced before anything runs on it."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text

from service.store import db as store_db
from service.store.dbadmin import libpq_url


@pytest.fixture
def pings(fresh_db: str, monkeypatch: pytest.MonkeyPatch) -> tuple[object, list[int]]:
    engine = store_db.get_engine(fresh_db)
    seen: list[int] = []
    ping = engine.dialect.do_ping
    monkeypatch.setattr(engine.dialect, "do_ping", lambda conn: (seen.append(1), ping(conn))[1])
    return engine, seen


def _pid(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT pg_backend_pid()")).scalar_one()


def test_a_connection_back_a_moment_ago_is_not_pinged(pings) -> None:
    engine, seen = pings
    first = _pid(engine)
    assert [_pid(engine) for _ in range(5)] == [first] * 5  # the same pooled connection each time
    assert seen == []


def test_a_terminated_backend_is_replaced_at_checkout_without_an_error(pings, fresh_db: str) -> None:
    engine, seen = pings
    old = _pid(engine)
    with psycopg.connect(libpq_url(fresh_db), autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (old,)).fetchone()[0]
        admin.execute("SELECT pg_sleep(0.2)")  # the backend's FATAL and end of file reach the pooled socket
    new = _pid(engine)  # within PING_IDLE_S: the unread end made it ping, fail and connect anew
    assert new != old and len(seen) == 1


def test_a_connection_idle_past_the_bound_is_pinged(pings, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, seen = pings
    first = _pid(engine)
    monkeypatch.setattr(store_db, "PING_IDLE_S", 0.0)
    assert _pid(engine) == first and len(seen) == 1  # pinged, alive, kept


# Attack (helper-43): under a storm of backend terminations (or idle_session_timeout), a dead pooled connection's
# replacement ended too before it was handed out; the checkout pinged it (its socket read the end), failed a
# second time, and SQLAlchemy gave up on the checkout: InvalidRequestError "This connection is closed", which is
# no database error, so a 500. A connection just made is not pinged (nor was it by pool_pre_ping): its first
# statement fails, with the database's own error, which the API answers with a 503 to retry.
def test_a_replacement_that_dies_at_once_fails_as_the_databases_error(pings, fresh_db: str) -> None:
    from sqlalchemy import event
    from sqlalchemy.exc import DBAPIError

    from service.api.errors import db_error_response

    engine, seen = pings
    old = _pid(engine)
    admin = psycopg.connect(libpq_url(fresh_db), autocommit=True)

    def end_at_once(dbapi_connection, record) -> None:  # the database ends each new backend as it starts
        pid = dbapi_connection.info.backend_pid
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        admin.execute("SELECT pg_sleep(0.2)")  # its FATAL and end of file reach the new socket

    try:
        admin.execute("SELECT pg_terminate_backend(%s)", (old,))
        admin.execute("SELECT pg_sleep(0.2)")
        event.listen(engine, "connect", end_at_once)
        with pytest.raises(DBAPIError) as failed, engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        answer = db_error_response(failed.value)
        assert answer is not None and answer.status_code == 503
        assert len(seen) == 1  # the old connection was pinged (and replaced); its replacement was not
    finally:
        event.remove(engine, "connect", end_at_once)
        admin.close()
    assert _pid(engine) != old  # and the pool recovers: the next checkout connects anew
