"""Scratch databases on a server (tests and benchmarks each get their own, then drop it)."""

from __future__ import annotations

import uuid

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


def create_database(server_url: str, prefix: str = "gc") -> str:
    """CREATE DATABASE <prefix>_<random> on the server of ``server_url``; returns its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_database(server_url: str, url: str) -> None:
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))
    admin.dispose()


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL as plain libpq/psycopg conninfo."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
