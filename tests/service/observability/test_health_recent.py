"""/healthz answers its recent database check from memory (issue 26: it never waits on the database while
probes keep coming), yet still reports a database that stopped answering: the next check's result, and
never a result older than ``healthz_fresh_s + readyz_timeout_s + 1`` s."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from service.store.dbadmin import libpq_url


@contextmanager
def _client(fresh_db: str, **settings) -> Iterator:
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings
    from service.store.db import dispose_engine

    app = create_app(Settings(database_url=fresh_db, embedded_worker=False, **settings), database_url=fresh_db)
    try:
        with TestClient(app) as c:
            yield c
    finally:
        dispose_engine(fresh_db)


@contextmanager
def _schema_locked(fresh_db: str) -> Iterator[None]:
    """Every read of alembic_version (what /healthz asks) blocks until the lock goes."""
    with psycopg.connect(libpq_url(fresh_db)) as conn:
        conn.execute("LOCK TABLE alembic_version IN ACCESS EXCLUSIVE MODE")
        yield
        conn.rollback()


def _until(c, want: int, budget_s: float = 30.0):
    deadline = time.monotonic() + budget_s
    while (r := c.get("/healthz")).status_code != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return r


def test_healthz_answers_its_recent_check_while_the_next_one_waits_then_reports_it(fresh_db: str) -> None:
    with _client(fresh_db, healthz_fresh_s=0, readyz_timeout_s=3) as c:
        assert c.get("/healthz").status_code == 200  # the first call awaits its check
        with _schema_locked(fresh_db):
            r = c.get("/healthz")  # the last result (ok) is answered; a check starts and blocks behind the lock
            assert r.status_code == 200 and r.json()["status"] == "ok", r.text
            r = _until(c, 503)  # that check's verdict reaches the next callers
            assert r.status_code == 503 and "no answer within 3 s" in r.json()["error"], r.text
            assert r.headers["Retry-After"] == "1"
        r = _until(c, 200)  # and the database answering again is seen again
        assert r.json() == {"status": "ok", "schema": r.json()["schema"]} and r.json()["schema"]


@pytest.mark.parametrize("fresh_s", [0.0, 0.5])
def test_healthz_never_answers_a_result_older_than_its_limit(fresh_db: str, fresh_s: float) -> None:
    """Nobody asked for longer than fresh + timeout + 1 s: the old result is not trusted, the call waits."""
    with _client(fresh_db, healthz_fresh_s=fresh_s, readyz_timeout_s=0.5) as c:
        assert c.get("/healthz").status_code == 200
        with _schema_locked(fresh_db):
            time.sleep(fresh_s + 0.5 + 1.0 + 0.3)
            r = c.get("/healthz")
            assert r.status_code == 503 and "no answer within 0.5 s" in r.json()["error"], r.text
