"""service.store.dbadmin: scratch databases made and dropped over one reused admin connection, which survives
the server ending it and is never shared with a forked child."""

from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from sqlalchemy.engine import make_url

from service.store.dbadmin import _admin, create_database, drop_database, libpq_url


@pytest.fixture
def own_url(server_url: str) -> str:
    """The session's server under a URL of this test's own (its own admin engine: the suite's background drops
    share the session URL's engine, and their connections come and go)."""
    return make_url(server_url).update_query_dict({"application_name": f"gc-test-{uuid.uuid4().hex[:8]}"}) \
        .render_as_string(hide_password=False)


def _exists(server_url: str, url: str) -> bool:
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        name = make_url(url).database
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def _admin_pids(server_url: str) -> set[int]:
    """Backend pids of the admin engine's pooled connections (checked in: idle)."""
    pool = _admin(server_url, "").pool
    pids = set()
    conns = [pool.connect() for _ in range(pool.checkedin())]
    for conn in conns:
        pids.add(conn.dbapi_connection.info.backend_pid)  # type: ignore[union-attr]
    for conn in conns:
        conn.close()
    return pids


def test_databases_are_made_and_dropped_over_one_reused_connection(own_url):
    server_url = own_url
    first = create_database(server_url, "gcadm")
    pids = _admin_pids(server_url)
    second = create_database(server_url, "gcadm", template=first)
    drop_database(server_url, first)
    assert _admin_pids(server_url) == pids and pids  # no new backend for the second create or the drop
    assert _exists(server_url, second) and not _exists(server_url, first)
    drop_database(server_url, second)
    assert not _exists(server_url, second)


def test_an_admin_connection_the_server_ended_is_replaced(own_url):
    server_url = own_url
    url = create_database(server_url, "gcadm")
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        for pid in _admin_pids(server_url):
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    drop_database(server_url, url)  # a dead pooled connection is noticed (pre-ping), not an error
    assert not _exists(server_url, url)


def test_a_forked_child_opens_its_own_connection_and_leaves_the_parents_alone(own_url):
    """The child's statements go over a connection of its own: the parent's pooled one (same socket, inherited)
    is neither used nor closed by the child, so the parent's next statement works."""
    server_url = own_url
    made = create_database(server_url, "gcadm")  # the parent's pool now holds a connection
    parent_pids = _admin_pids(server_url)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop the parent's database, report its own backend, exit without cleanup
        code = 1
        try:
            os.close(read)
            drop_database(server_url, made)
            os.write(write, ",".join(map(str, _admin_pids(server_url))).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        child_pids = {int(p) for p in pipe.read().split(",") if p}
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_pids and not child_pids & parent_pids
    assert not _exists(server_url, made)
    again = create_database(server_url, "gcadm")  # the parent's connection still works after the child exited
    assert _admin_pids(server_url) == parent_pids
    drop_database(server_url, again)


def test_the_admin_database_itself_can_be_copied(own_url):
    """Attack (helper-53): with ``server_url``'s own database as the template, the reused engine's idle connections
    to it made every CREATE ... TEMPLATE fail as "being accessed by other users" (after ~4 minutes of retries)."""
    admin_db = create_database(own_url, "gcadm")
    admin_url = make_url(own_url).set(database=make_url(admin_db).database).render_as_string(hide_password=False)
    made = [create_database(admin_url, "gcadm")]  # the admin engine of admin_url now holds an idle connection
    made.append(create_database(admin_url, "gcadm", template=admin_url))  # a copy of the admin database itself
    assert all(_exists(own_url, url) for url in made)
    for url in [*made, admin_db]:
        drop_database(own_url, url)


def test_more_concurrent_statements_than_the_pool_keeps_all_go_through(own_url):
    """Attack (helper-53): a pool capped at 10 connections made an 11th concurrent caller wait for one of the 10,
    then fail with SQLAlchemy's 30 s pool timeout (12 DROPs waiting on a lock: 2 failed); each statement gets a
    connection, as with a connection per statement. 11 connections held as 11 statements in flight would."""
    held = [_admin(own_url, "").connect() for _ in range(11)]
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            url = pool.submit(create_database, own_url, "gcadm").result(timeout=20)
        drop_database(own_url, url)
    finally:
        for conn in held:
            conn.close()
    assert not _exists(own_url, url)
    assert _admin(own_url, "").pool.checkedin() <= 2  # the connections beyond the pool's 2 are closed, not kept
