"""Scratch databases on a server (tests and benchmarks each get their own, then drop it)."""

from __future__ import annotations

import os
import threading
import time
import uuid

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

# SQLSTATE 55006 object_in_use: the template has another connection (a clone finishing, autovacuum)
_IN_USE = "55006"

# One AUTOCOMMIT engine per server URL for this process's CREATE / DROP DATABASE statements: a connection is
# opened once and reused, not opened and closed around each statement (a test run creates and drops a few
# hundred databases; measured on 2 cores, bench side by side: 290-350 ms of machine CPU a database made and
# dropped with an engine and a connection per statement, 210 ms over the reused one). A forked child never
# uses its parent's connections (they are forgotten in the child, not closed under the parent).
_admins: dict[str, Engine] = {}
_admins_lock = threading.Lock()


def _admin(server_url: str, copies: str) -> Engine:
    """The reused engine of ``server_url``, or a one-off one (NullPool: no connection stays) when the statement
    copies the admin database itself (``copies``: the template's name): an idle connection of ours to it would
    make the copy fail as "being accessed by other users". No cap on concurrent statements (max_overflow -1:
    a caller never waits for another's DROP); a connection the network silently lost fails within 10 s
    (tcp_user_timeout) and is replaced (pre-ping), instead of hanging."""
    if make_url(server_url).database == copies:
        with _admins_lock:
            kept = _admins.pop(server_url, None)
        if kept is not None:
            kept.dispose()  # its idle connections are to the database being copied
        return create_engine(server_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with _admins_lock:
        engine = _admins.get(server_url)
        if engine is None:
            engine = create_engine(server_url, isolation_level="AUTOCOMMIT", pool_size=2, max_overflow=-1,
                                   pool_pre_ping=True, connect_args={"tcp_user_timeout": 10_000})
            _admins[server_url] = engine
        return engine


def _forget_admins_in_child() -> None:
    global _admins_lock
    _admins_lock = threading.Lock()  # another thread of the parent may have held it at the fork
    for engine in _admins.values():
        engine.dispose(close=False)
    _admins.clear()


os.register_at_fork(after_in_child=_forget_admins_in_child)


def create_database(server_url: str, prefix: str = "gc", template: str | None = None) -> str:
    """CREATE DATABASE <prefix>_<random> on the server of ``server_url``; returns its URL. ``template``:
    the URL of a database to copy (it must have no open connection; a brief one is waited out)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    sql = f'CREATE DATABASE "{name}"'
    if template is not None:
        sql += f' TEMPLATE "{make_url(template).database}"'
    for attempt in range(50):
        try:
            with _admin(server_url, (make_url(template).database or "") if template else "template1").connect() as conn:
                conn.execute(text(sql))
            break
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != _IN_USE or attempt == 49:
                raise
            time.sleep(0.1)
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def freeze_template(server_url: str, url: str) -> None:
    """Mark ``url``'s database as a template that takes no connections (so nothing, autovacuum included,
    holds it open while it is copied). ``drop_database`` still drops it."""
    with _admin(server_url, "").connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{make_url(url).database}" WITH ALLOW_CONNECTIONS false'))


def drop_database(server_url: str, url: str) -> None:
    with _admin(server_url, "").connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL as plain libpq/psycopg conninfo."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
