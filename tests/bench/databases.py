"""What the bench tests check of a benchmark's private database: it is dropped when the benchmark ends."""

from __future__ import annotations

import psycopg

from service.store.dbadmin import libpq_url


def databases(server_url: str, prefix: str) -> set[str]:
    """The names of the server's databases that start with ``prefix`` (a benchmark's private ones)."""
    with psycopg.connect(libpq_url(server_url)) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (prefix,))
        return {r[0] for r in rows}
