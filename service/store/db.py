"""Engine, sessions and the embedded PostgreSQL.

The request-scoped session dependency owns the transaction: it commits when the route returns and rolls
back when it raises, so a rejected request stores nothing. Workers open one ``with SessionLocal.begin():``
per unit of work.
"""

from __future__ import annotations

import atexit
import logging
import select
import threading
import time
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from psycopg.pq import ConnStatus
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import InvalidatePoolError
from sqlalchemy.orm import Session, sessionmaker

from service.settings import Settings, get_settings
from service.store.embedded import lock_down, start_server
from service.store.processes import prune_dead_handles

log = logging.getLogger(__name__)

_lock = threading.Lock()
_embedded: dict[str, object] = {}
_engines: dict[str, Engine] = {}


def to_sqlalchemy_url(url: str) -> str:
    """Normalise ``postgres://`` / ``postgresql://`` URLs to the psycopg 3 driver."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    raise ValueError(f"DATABASE_URL: expected a postgresql:// URL, got {url.split(':', 1)[0]}://...")


def start_embedded(data_dir: Path) -> str:
    """Start (or attach to) the embedded PostgreSQL in ``data_dir``; returns its URL.

    The data directory survives restarts; the server is stopped when the last process using it exits.
    """
    with warnings.catch_warnings():  # platformdirs warns once about XDG_RUNTIME_DIR; not the user's concern
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import pgserver  # noqa: F401  # imported here so its warning is silenced; service/store/embedded.py uses it

    key = str(data_dir.resolve())
    with _lock:
        if key not in _embedded:
            data_dir.mkdir(parents=True, exist_ok=True)
            prune_dead_handles(data_dir)  # a killed user of the server must not keep it running forever
            _embedded[key] = start_server(data_dir)  # locked down before it first listens (service/store/embedded.py)
            # atexit runs last-registered first: drop killed co-users before pgserver counts the users left
            atexit.register(prune_dead_handles, data_dir)
            lock_down(_embedded[key].get_uri(), data_dir)  # type: ignore[attr-defined]  # service/store/embedded.py
        server = _embedded[key]
    return server.get_uri()  # type: ignore[attr-defined]


def resolve_database_url(settings: Settings | None = None) -> str:
    settings = settings or get_settings()
    if settings.database_url:
        return to_sqlalchemy_url(settings.database_url)
    return to_sqlalchemy_url(start_embedded(settings.embedded_dir))


def _json_dumps(value: object) -> str:
    return orjson.dumps(value).decode()


_NO_JIT = "-c jit=off"


def _cached_engine(url: str, settings: Settings, options: str | None = None) -> Engine:
    """One engine per (URL, connection options) for the process: the pool settings and JSON codecs every
    engine of the project shares."""
    # no JIT: every statement here is short; PostgreSQL compiles one whose estimated cost passes
    # jit_above_cost, and a misestimate (statistics behind a bulk load) spent ~200 ms compiling a 1,000-group
    # stats query that runs in less (bench/scale.py)
    options = " ".join(o for o in (_NO_JIT, options) if o)
    key = f"{url}#{options}"
    with _lock:
        if key not in _engines:
            engine = create_engine(
                url,
                pool_size=settings.db_pool_size,
                max_overflow=settings.db_max_overflow,
                json_serializer=_json_dumps,
                json_deserializer=orjson.loads,
                connect_args={"options": options},
            )
            _check_on_checkout(engine)
            _engines[key] = engine
        return _engines[key]


# A pooled connection is pinged (SELECT 1: a round trip) when it is checked out, unless it came back to the pool
# less than this long ago and its socket holds nothing unread: a server that shut down, restarted or ended the
# backend (pg_terminate_backend, idle_session_timeout) closed the socket, so it reads an end of file (after a
# FATAL message) and is pinged, fails and goes with every older connection, as pool_pre_ping would. What only a
# ping sees is a peer gone without a word (a network cut, a middlebox dropping idle flows): that takes a while
# idle, and then the connection is pinged. A pre-ping on every checkout was two of a gateway call's five round
# trips (docs/agents.md, "What a call costs").
PING_IDLE_S = 10.0
_RETURNED_AT = "grpo_curator_returned_at"
_FRESH = "connected, never checked in"


def _check_on_checkout(engine: Engine) -> None:
    def connected(dbapi_connection: Any, record: Any) -> None:
        record.info[_RETURNED_AT] = _FRESH  # new: as good as a ping (pool_pre_ping skips it too)

    def checked_in(dbapi_connection: Any, record: Any) -> None:
        record.info[_RETURNED_AT] = time.monotonic()

    def checked_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        returned = record.info.get(_RETURNED_AT)
        if returned is _FRESH:
            # never pinged: the pool tries a checkout twice, and a failed ping of the connection it just made in
            # place of a dead one (ended too, a moment later) was the second try: "This connection is closed", a
            # 500. Unpinged, its first statement fails instead: the database's error, a 503 to retry.
            return
        if returned is not None and time.monotonic() - returned < PING_IDLE_S and _nothing_unread(dbapi_connection):
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as exc:  # as pool_pre_ping: the pool connects anew and goes on
            raise InvalidatePoolError(f"ping on checkout failed: {exc}") from exc

    event.listen(engine, "connect", connected)
    event.listen(engine, "checkin", checked_in)
    event.listen(engine, "checkout", checked_out)


def _nothing_unread(dbapi_connection: Any) -> bool:
    """Whether a psycopg connection is open and its socket has nothing to read (no end of file, no message)."""
    try:
        pgconn = dbapi_connection.pgconn
        if dbapi_connection.closed or pgconn.status != ConnStatus.OK:
            return False
        poller = select.poll()  # (not select.select: the descriptor may be past FD_SETSIZE, serve raises the limit)
        poller.register(pgconn.socket, select.POLLIN)
        return not poller.poll(0)
    except Exception:  # not psycopg's, or its socket gone: the ping decides
        return False


def get_engine(url: str | None = None) -> Engine:
    settings = get_settings()
    return _cached_engine(url or resolve_database_url(settings), settings)


def worker_options(settings: Settings | None = None) -> str:
    """The server-side bounds of a score / curate worker's connections (libpq ``options``): a transaction
    left idle longer than ``worker_idle_in_transaction_s`` (its worker frozen: SIGSTOP, a VM pause, a
    partition) is ended by the server, its locks with it -- the refund lock above all, so a frozen worker
    blocks other workers' crash recovery at most that long -- and a statement waits for a lock at most
    ``worker_lock_timeout_s``."""
    settings = settings or get_settings()
    idle = max(1, round(settings.worker_idle_in_transaction_s * 1000))
    lock = max(1, round(settings.worker_lock_timeout_s * 1000))
    return f"-c idle_in_transaction_session_timeout={idle} -c lock_timeout={lock}"


def worker_engine(url: str | None = None, settings: Settings | None = None) -> Engine:
    """An engine for a score / curate worker: ``get_engine``'s, with ``worker_options`` on every
    connection (the API's connections keep no such bound: a slow export's client is not a frozen worker)."""
    settings = settings or get_settings()
    return _cached_engine(url or resolve_database_url(settings), settings, worker_options(settings))


def dispose_engine(url: str) -> None:
    """Close the pooled connections of ``url``'s engines and forget them (a database that is done with)."""
    with _lock:
        engines = [_engines.pop(k) for k in list(_engines) if k == url or k.startswith(url + "#")]
    for engine in engines:
        engine.dispose()


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False, autoflush=False)


def statements_on_their_own(session: Session) -> None:
    """Run what ``session`` executes next each statement on its own (autocommit: no BEGIN / COMMIT round trips,
    each sees what was committed before it), until it commits or rolls back: for a read that one statement
    answers, or reads whose every statement stands alone. Only for a session that holds no transaction yet and
    takes its connections from the engine; one bound to a caller's connection keeps that caller's transaction."""
    if not session.in_transaction() and isinstance(session.get_bind(), Engine):
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})


def db_now(session: Session) -> datetime:
    """The database's clock: every time that SQL compares with ``clock_timestamp()`` (a retry's ``retry_at``,
    a wait's ``wait_until``, a curation's ``curated_at``) is taken from it, never from the process's own clock
    (a worker's clock may be skewed from the database's)."""
    return session.execute(text("SELECT clock_timestamp()")).scalar_one()
