"""GET /v1/stats reads its rollup with each statement on its own (no BEGIN / COMMIT); when PostgreSQL ends the
backend it reads on (pg_terminate_backend, a restart, a failover), the answer is the database's error, a 503
with Retry-After to retry, never a 500, and the next request is answered (attack on the autocommit read,
helper-45: its ending commit replaced the error with SQLAlchemy's PendingRollbackError, a 500)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.conftest import LiveServer, start_server, stop_server
from tests.helpers import end_the_backend_it_waits_on


@pytest.fixture(scope="module")
def server(make_db: Callable[..., str]) -> Iterator[LiveServer]:
    live = start_server(make_db())
    yield live
    stop_server(live)


@pytest.mark.parametrize("query", [{}, {"since": "2020-01-01T00:00:00Z"}], ids=["all-time", "since"])
@pytest.mark.parametrize("end", ["pg_terminate_backend", "pg_cancel_backend"])
def test_a_stats_read_whose_backend_is_ended_is_a_503_to_retry(server: LiveServer, query: dict, end: str) -> None:
    assert httpx.get(server.url + "/v1/stats", params=query).status_code == 200
    r = end_the_backend_it_waits_on(
        server.db_url, "stats_cells", lambda: httpx.get(server.url + "/v1/stats", params=query, timeout=30), end)
    assert r.status_code == 503 and "Retry-After" in r.headers, (r.status_code, r.text)
    assert httpx.get(server.url + "/v1/stats", params=query).status_code == 200
