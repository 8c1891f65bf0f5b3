"""Health probes that never wait behind request work: a database check on a connection of its own (kept
open between checks), single-flight sharing so a public probe costs at most one connection however
often it is called, and a recent result answered from memory while the next check runs (``RecentCheck``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

_connections: dict[tuple[asyncio.AbstractEventLoop, str], psycopg.AsyncConnection] = {}


async def _connect(conninfo: str, timeout_s: float) -> psycopg.AsyncConnection:
    ms = max(1, int(timeout_s * 1000))
    return await psycopg.AsyncConnection.connect(conninfo, autocommit=True, connect_timeout=max(1, round(timeout_s)),
                                                 options=f"-c statement_timeout={ms}")


async def _revision(conn: psycopg.AsyncConnection) -> str | None:
    row = await (await conn.execute("SELECT version_num FROM alembic_version")).fetchone()
    return row[0] if row else None


async def _discard(key: tuple[asyncio.AbstractEventLoop, str]) -> None:
    conn = _connections.pop(key, None)
    if conn is not None:
        try:
            await conn.close()
        except Exception:  # noqa: BLE001 - a broken connection may fail to close; it is gone either way
            pass


async def check_database(conninfo: str, timeout_s: float) -> tuple[str | None, str | None]:
    """(schema revision, None) when the database answers within ``timeout_s``, else (None, what failed).

    A connection of its own (never the pool's, so a saturated pool does not hide a reachable database and a
    probe never waits for a pooled connection), kept open between checks (one per event loop and
    database): a check is one round trip, not a new PostgreSQL backend (fork, authentication, settings)
    each time -- on a loaded machine that setup was most of a check's time. A kept connection that fails
    (the server restarted) is replaced by a new one within the same check, so a restart is not reported
    as an outage; any failure or timeout discards it."""
    loop = asyncio.get_running_loop()
    for stale in [k for k in _connections if k[0].is_closed()]:
        _connections.pop(stale, None)
    key = (loop, conninfo)

    async def probe() -> str | None:
        conn = _connections.get(key)
        if conn is not None and not conn.closed:
            try:
                return await _revision(conn)
            except psycopg.OperationalError:  # the kept connection died: ask on a new one
                await _discard(key)
        _connections[key] = conn = await _connect(conninfo, timeout_s)
        return await _revision(conn)

    task = asyncio.ensure_future(probe())
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:  # answer now; the stuck probe and its connection are dropped in the background
        _abandon(task, _connections.pop(key, None))
        return None, f"no answer within {timeout_s:g} s"
    try:
        return task.result(), None
    except psycopg.Error as exc:
        await _discard(key)
        return None, f"unavailable ({type(exc).__name__})"


_abandoned: set[asyncio.Future] = set()  # stuck probes being dropped (kept referenced until they end)


def _abandon(task: asyncio.Future, conn: psycopg.AsyncConnection | None) -> None:
    """Drop a probe that did not answer in time without awaiting it: cancelling a query against a stalled
    server makes psycopg wait (up to seconds) for the server to acknowledge the cancel, and /healthz must
    answer within ``readyz_timeout_s``. The task is cancelled and its connection closed once it ends, both
    in the background."""

    async def drop() -> None:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    cleanup = asyncio.ensure_future(drop())
    _abandoned.add(cleanup)
    cleanup.add_done_callback(_abandoned.discard)


class SingleFlight:
    """At most one ``check()`` in flight per event loop; concurrent callers await the same one. A public
    probe route therefore costs at most one database connection however often it is called."""

    def __init__(self, check: Callable[[], Awaitable[Any]]) -> None:
        self.check = check
        self._tasks: dict[asyncio.AbstractEventLoop, asyncio.Future] = {}

    async def __call__(self) -> Any:
        loop = asyncio.get_running_loop()
        task = self._tasks.get(loop)
        if task is None or task.done():
            self._tasks = {lp: t for lp, t in self._tasks.items() if not lp.is_closed()}
            task = self._tasks[loop] = asyncio.ensure_future(self.check())
        return await asyncio.shield(task)


class RecentCheck:
    """The last result of ``check()``, answered from memory while it is recent, so a probe request does
    not wait on the database (stale-while-revalidate).

    Under load every ``await`` that suspends a request costs it one turn of the event loop behind the
    long polls and ingest the loop also serves; a check answered from the database (a task, a round trip,
    the wake-ups back) took several such turns, and at 500 long polls that was most of /healthz's p99.
    A result younger than ``fresh_s`` is answered as is; an older one is still answered, and one check is
    started in the background (single-flight) whose result the next callers get; a result older than
    ``stale_s`` (nobody asked for a while, or the first call) is not trusted: the caller awaits a fresh
    check. So what a probe reports is at most ``stale_s`` old, and with ``stale_s >= fresh_s + the
    check's timeout`` a steady stream of probes never waits on the database."""

    def __init__(self, check: Callable[[], Awaitable[Any]], fresh_s: float, stale_s: float) -> None:
        self.flight = SingleFlight(check)
        self.fresh_s, self.stale_s = fresh_s, max(stale_s, fresh_s)
        self._last: tuple[float, Any] | None = None  # (monotonic time it was taken, result)
        self._refresh: dict[asyncio.AbstractEventLoop, asyncio.Future] = {}

    async def _take(self) -> Any:
        started = time.monotonic()
        result = await self.flight()
        if self._last is None or self._last[0] <= started:
            self._last = (started, result)
        return result

    def recent(self) -> tuple[bool, Any]:
        """(True, result) when the last result may be answered now (a check starts in the background
        when it is past ``fresh_s``), else (False, None)."""
        if self._last is None:
            return False, None
        taken, result = self._last
        age = time.monotonic() - taken
        if age > self.stale_s:
            return False, None
        if age > self.fresh_s:
            loop = asyncio.get_running_loop()
            task = self._refresh.get(loop)
            if task is None or task.done():
                self._refresh = {lp: t for lp, t in self._refresh.items() if not lp.is_closed()}
                self._refresh[loop] = asyncio.ensure_future(self._take())
        return True, result

    async def __call__(self) -> Any:
        ok, result = self.recent()
        if ok:
            return result  # no suspension: answered in the loop turn that runs the request
        return await self._take()
