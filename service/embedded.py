"""Lock the embedded PostgreSQL (pgserver) down to the service's own OS user.

What pgserver does: ``initdb --auth=trust --auth-local=trust`` and a server started with ``-h ""`` (no
TCP listener) and ``-k <dir>`` (a unix socket in the data directory, or under the user's runtime
directory when that path is too long; a runtime directory is made 0777 when running as root). The socket
itself gets PostgreSQL's default mode 0777, so with trust authentication any local user who can reach
the socket directory is the superuser.

What this adds, on every start: ``pg_hba.conf`` admits unix-socket connections only (no ``host`` lines at
all, so even a TCP listener switched on by hand would admit nobody); ``listen_addresses = ''`` and
``unix_socket_permissions = 0700`` are persisted with ALTER SYSTEM (they apply from the next start) and
the running server's socket is chmod-ed 0700 now; the data directory stays 0700. Only the OS user that
owns the server (pgserver's ``pgserver`` user when run as root) and root can then connect.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

HBA = (
    "# written by grpo-curator (service/embedded.py): unix-socket connections only; the socket is 0700,\n"
    "# so only the server's OS user (and root) can reach it. There are no host lines: TCP admits nobody.\n"
    "local all all trust\n"
)
SOCKET_MODE = 0o700


def socket_dir(uri: str) -> Path:
    host = make_url(uri).query.get("host")
    if not host:
        raise ValueError("embedded PostgreSQL: expected a unix-socket URI (host=<directory>)")
    return Path(host if isinstance(host, str) else host[0])


def lock_down(uri: str, pgdata: Path) -> None:
    """Apply the lockdown to a running embedded server (idempotent)."""
    hba = pgdata / "pg_hba.conf"
    changed = hba.read_text() != HBA
    if changed:
        hba.write_text(HBA)  # an existing file keeps its owner
    for sock in socket_dir(uri).glob(".s.PGSQL.*"):
        if not sock.name.endswith(".lock"):
            os.chmod(sock, SOCKET_MODE)
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET listen_addresses = ''")
        conn.execute("ALTER SYSTEM SET unix_socket_permissions = '0700'")
        if changed:
            conn.execute("SELECT pg_reload_conf()")
    os.chmod(pgdata, 0o700)
