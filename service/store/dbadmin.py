"""Scratch databases on a server (tests and benchmarks each get their own, then drop it)."""

from __future__ import annotations

import time
import uuid

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

# SQLSTATE 55006 object_in_use: the template has another connection (a clone finishing, autovacuum)
_IN_USE = "55006"


def create_database(server_url: str, prefix: str = "gc", template: str | None = None) -> str:
    """CREATE DATABASE <prefix>_<random> on the server of ``server_url``; returns its URL. ``template``:
    the URL of a database to copy (it must have no open connection; a brief one is waited out)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    sql = f'CREATE DATABASE "{name}"'
    if template is not None:
        sql += f' TEMPLATE "{make_url(template).database}"'
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        for attempt in range(50):
            try:
                with admin.connect() as conn:
                    conn.execute(text(sql))
                break
            except OperationalError as exc:
                if getattr(exc.orig, "sqlstate", None) != _IN_USE or attempt == 49:
                    raise
                time.sleep(0.1)
    finally:
        admin.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def freeze_template(server_url: str, url: str) -> None:
    """Mark ``url``'s database as a template that takes no connections (so nothing, autovacuum included,
    holds it open while it is copied). ``drop_database`` still drops it."""
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{make_url(url).database}" WITH ALLOW_CONNECTIONS false'))
    admin.dispose()


def drop_database(server_url: str, url: str) -> None:
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))
    admin.dispose()


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL as plain libpq/psycopg conninfo."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
