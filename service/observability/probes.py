"""Health probes that never wait behind request work: a database check on a connection of its own, and
single-flight sharing so a public probe costs at most one connection however often it is called."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg


async def check_database(conninfo: str, timeout_s: float) -> tuple[str | None, str | None]:
    """(schema revision, None) when the database answers within ``timeout_s``, else (None, what failed). A
    connection of its own (never the pool's, so a saturated pool does not hide a reachable database and a
    probe never waits for a pooled connection), closed at once."""

    async def probe() -> str | None:
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True,
                                                     connect_timeout=max(1, round(timeout_s)))
        try:
            ms = max(1, int(timeout_s * 1000))
            await conn.execute(f"SET statement_timeout = {ms}")
            row = await (await conn.execute("SELECT version_num FROM alembic_version")).fetchone()
            return row[0] if row else None
        finally:
            await conn.close()

    try:
        return await asyncio.wait_for(probe(), timeout_s), None
    except TimeoutError:
        return None, f"no answer within {timeout_s:g} s"
    except psycopg.Error as exc:
        return None, f"unavailable ({type(exc).__name__})"


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
