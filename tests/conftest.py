"""Shared fixtures: a real PostgreSQL (DATABASE_URL, or an embedded pgserver when unset), migrated by Alembic.

- ``template_db``: one database per session (per pytest-xdist worker) upgraded to head by Alembic, so
  migrations run on every run; every migrated database below is a copy of it (CREATE DATABASE ...
  TEMPLATE), not a new migration.
- ``db_url``: one database for the session (per worker), a copy of the template.
- ``session``: each test runs inside a transaction that is rolled back (join_transaction_mode="create_savepoint").
- ``client``: FastAPI's TestClient over the real app, its request sessions joined to that transaction.
- ``fresh_db``: a new, empty, migrated database for tests that need real concurrency or real processes.
- ``live_server``: the app under uvicorn in a process of its own on a fresh database (real HTTP, real
  processes): ``start_server`` forks ``grpo-curator serve`` from a zygote that imported it once
  (tests/forked_cli.py), a subprocess when it runs several workers.
- ``api``: a TestClient over a fresh database whose requests really commit (a worker reads them), with
  ``api.factory`` for the worker; ``scorer``: one real Scorer (a killable process pool) per module.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from service.client import wait_healthy
from service.store.db import to_sqlalchemy_url
from service.store.dbadmin import create_database, drop_database, freeze_template
from service.store.migrate import upgrade
from service.store.processes import exit_on_signals
from tests.forked_cli import ForkedProcess, Zygote

ROOT = Path(__file__).resolve().parents[1]


# The longest files first (summed test time of a full run on CI's 2 cores, 2026-12-06): with --dist loadfile a
# file is one unit of work, and a 100 s file handed out last is a 100 s tail with the other workers idle.
# xdist's own order (--loadscope-reorder, on by default) puts the files with the most tests first, i.e. these
# single-test, minute-long files last; `make test` turns it off (--no-loadscope-reorder) and this order rules.
# Files not named keep their place after these. A name that no longer exists costs nothing.
LONGEST_FIRST = (
    "tests/rollout/test_vllm.py",  # 110 s (vLLM's server start)
    "tests/rollout/test_vllm_restart.py",  # 99 s (two vLLM starts)
    "tests/test_docs.py",  # 112 s
    "tests/rollout/test_demo_agent.py",  # ~45-70 s loaded (the demo end to end, its agent stage)
    "tests/service/alerts/test_synthetic_long_run.py",  # 87 s
    "tests/service/worker/test_crash_recovery.py",  # 75 s
    "tests/service/store/test_embedded.py",  # 69 s
    "tests/service/delivery/test_long_poll_wakeups.py",  # 67 s
    "tests/trainer/test_worker_crash.py",  # 59 s
    "tests/service/alerts/test_breaker.py",  # 57 s
    "tests/service/api/test_fuzz_api_negative.py",  # 52 s
    "tests/service/alerts/test_synthetic_runs.py",  # 51 s
    "tests/service/sessions/test_gateway_failures.py",  # 50 s
    "tests/test_chaos.py",  # 50 s
    "tests/service/export/test_export_memory.py",  # 49 s
    "tests/service/cli/test_cli.py",  # 38 s
    "tests/test_dev_venv_cache.py",  # ~20 s (make install-dev-cached against fake caches)
    "tests/service/observability/test_dashboard_browser.py",  # 37 s
    "tests/bench/test_scale.py",  # 37 s
    "tests/trainer/test_extreme_logprobs.py",  # 34 s
    "tests/service/delivery/test_lease_concurrency.py",  # 32 s
    "tests/service/api/test_slow_clients_and_scores.py",  # 31 s
    "tests/integrations/test_openrlhf_011_upstream.py",  # 30 s
    "tests/service/archive/test_archive_kill.py",  # 29 s
    "tests/service/sessions/test_tool_misuse_episode.py",  # 27 s
    "tests/service/delivery/test_long_poll.py",  # 26 s
    "tests/service/scoring/test_score_budget.py",  # 25 s
    "tests/rollout/test_producer_service.py",  # ~25 s
    "tests/service/worker/test_pipeline_failures.py",  # 23 s
)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """The test processes' own garbage collector, after collection: what collection made (the test modules, their
    parameters, the libraries) is frozen out of every later collection, and the youngest generation is collected
    every 20,000 allocations instead of 700 (the suite's in-process tests allocate a great deal, little of it in
    cycles). Measured on 2 cores: 44.5 -> 38.9 CPU-s for the alert long run, the hostile-input and the fill-rule
    tests together. The services and workers the tests start keep Python's defaults: what they run is the product."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Items of the LONGEST_FIRST files first, in that order; every file's items stay together and in order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return rank.get(path, len(rank))

    items.sort(key=key)  # stable: the rest keep collection order


def _server_url() -> str:
    url = os.environ.get("TEST_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if url:
        return to_sqlalchemy_url(url)
    import pgserver

    # one server per test run, in its own temp dir: two checkouts (or two runs) never share one; it is
    # stopped and deleted when this process exits (SIGTERM included, see service.store.processes)
    exit_on_signals()
    data = Path(tempfile.mkdtemp(prefix="grpo-curator-test-pg-"))
    server = pgserver.get_server(data, cleanup_mode="delete")
    return to_sqlalchemy_url(server.get_uri())


@pytest.fixture(scope="session")
def server_url() -> str:
    return _server_url()


@pytest.fixture(scope="session")
def template_db(server_url: str) -> Iterator[str]:
    """A database upgraded to head by Alembic, then closed to connections: the template of every migrated
    database of this session (a copy takes ~0.1 s, a migration ~1 s)."""
    url = create_database(server_url, "gctpl")
    try:
        upgrade(url)  # NullPool (migrations/env.py): no connection stays open
        freeze_template(server_url, url)
        yield url
    finally:
        drop_database(server_url, url)


class Databases:
    """The session's databases: ``make()`` a new one at the head migration (a copy of ``template_db``), or empty
    when migrate=False. ``retire(url)`` drops one whose test is done in the background, several at once (each
    DROP DATABASE waits for a checkpoint, and concurrent drops share one), so a worker's drops overlap its
    tests instead of queueing at its end (a worker's few hundred databases took up to 55 s at the end of a
    loaded run, in the last test's teardown); ``close()`` waits for those and drops the rest."""

    def __init__(self, server_url: str, template: str) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.server_url, self.template = server_url, template
        self.made: list[str] = []
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="drop-db")

    def __call__(self, migrate: bool = True) -> str:
        url = create_database(self.server_url, "gct", template=self.template if migrate else None)
        self.made.append(url)
        return url

    def retire(self, url: str) -> None:
        def drop() -> None:
            drop_database(self.server_url, url)
            self.made.remove(url)  # list.remove is atomic under the GIL; one left here is dropped by close()

        self.pool.submit(drop)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        drop_databases(self.server_url, list(self.made))


@pytest.fixture(scope="session")
def make_db(server_url: str, template_db: str) -> Iterator[Databases]:
    """Factory: a new database at the head migration (a copy of ``template_db``), or empty when
    migrate=False (``Databases``); all dropped by the end."""
    databases = Databases(server_url, template_db)
    try:
        yield databases
    finally:
        databases.close()


def drop_databases(server_url: str, urls: list[str]) -> None:
    """Drop ``urls``, several at once: each DROP DATABASE waits for a checkpoint, and concurrent drops share
    one (measured: 20 drops one by one 2.2 s, 8 at a time 0.36 s)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in pool.map(lambda url: drop_database(server_url, url), urls):
            pass


@pytest.fixture(scope="session")
def db_url(make_db: Callable[..., str]) -> str:
    return make_db()


@pytest.fixture(scope="session")
def engine(db_url: str) -> Iterator[Engine]:
    from service.store.db import get_engine

    yield get_engine(db_url)


@pytest.fixture
def fresh_db(make_db: Databases) -> Iterator[str]:
    """A new migrated database for one test; its pooled connections are closed after the test (idle pools
    of finished tests would otherwise add up to PostgreSQL's max_connections over a full run)."""
    from service.store.db import dispose_engine

    url = make_db()
    yield url
    dispose_engine(url)
    make_db.retire(url)  # dropped in the background (a test's server, if any, was stopped in its own teardown)


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with engine.connect() as conn:
        outer = conn.begin()
        with Session(bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False) as s:
            yield s
        outer.rollback()


@pytest.fixture
def client(session: Session, db_url: str) -> Iterator:
    from fastapi.testclient import TestClient

    from service.api.deps import get_session
    from service.app import create_app

    app = create_app(database_url=db_url)

    def joined_session() -> Iterator[Session]:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise

    app.dependency_overrides[get_session] = joined_session
    with TestClient(app) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, url: str, db_url: str, proc: subprocess.Popen | ForkedProcess) -> None:
        self.url, self.db_url, self.proc = url, db_url, proc


# what ``grpo-curator serve`` imports before it serves: the app, uvicorn and the parts uvicorn picks at run time,
# and pandas, which the app's Arrow warm-up imports through pyarrow (service.delivery.arrow.warm_up)
SERVE_PRELOAD = ("service.cli.main", "service.app", "pandas", "service.store.db", "service.store.migrate", "alembic.command",
                 "alembic.config", "uvicorn", "uvicorn.config", "uvicorn.server", "uvicorn.main", "uvloop",
                 "uvicorn.loops.uvloop", "uvicorn.protocols.http.httptools_impl",
                 "uvicorn.protocols.websockets.websockets_impl", "uvicorn.lifespan.on", "service.worker.main")
_server_zygote: list[Zygote] = []


def server_zygote() -> Zygote:
    """One zygote per test process that imported what ``serve`` imports (~2 s of CPU per server start on 2
    cores, ~150 starts a run); closed when the process ends."""
    if not _server_zygote:
        _server_zygote.append(Zygote(cwd=str(ROOT), preload=SERVE_PRELOAD))
        atexit.register(_server_zygote[0].close)
    return _server_zygote[0]


def _listens(pid: int, port: int) -> bool:
    """Process ``pid`` holds the socket listening on 127.0.0.1:``port`` (Linux /proc): a /healthz answer on a
    port is only this server's when the listener is its own -- under pytest-xdist another worker's server
    can take the port between ``free_port`` and the bind, and would answer for it."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    for row in rows:
        cols = row.split()
        if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A" and f"socket:[{cols[9]}]" in inodes:
            return True
    return False


def start_server(db_url: str, *, env: dict[str, str] | None = None, workers: int = 1) -> LiveServer:
    full_env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "GRPO_CURATOR_EMBEDDED_WORKER": "false",
        "GRPO_CURATOR_LOG_LEVEL": "warning",
        **(env or {}),
    }
    for _ in range(5):  # a port taken by another process in between: again on another port
        port = free_port()
        argv = ["serve", "--port", str(port), "--workers", str(workers)]
        proc: subprocess.Popen | ForkedProcess
        if workers == 1:  # forked from the zygote: the same ``serve`` after its imports
            proc = server_zygote().spawn(argv, full_env, text=False, stdout=False)
        else:  # uvicorn's worker processes are started by the server: a process of its own
            proc = subprocess.Popen([sys.executable, "-m", "service.cli", *argv], env=full_env, cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, timeout_s=60)
            deadline = time.monotonic() + 30
            while not _listens(proc.pid, port) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)  # healthy, but maybe someone else's server on that port
        except RuntimeError as exc:
            proc.kill()
            log = proc.stderr.read().decode(errors="replace")  # type: ignore[union-attr]
            if "address already in use" in log.lower():
                continue
            raise RuntimeError(f"{exc}: {log[-2000:]}") from None
        if _listens(proc.pid, port):
            return LiveServer(url, db_url, proc)
        proc.kill()
        proc.wait()
    raise RuntimeError("no free port held long enough for the server to bind it")


def as_from_a_terminal() -> None:
    """``preexec_fn`` for a child a test interrupts or hangs up: SIGINT and SIGHUP at their defaults, as a
    command typed in a terminal has them. The run's own parent may hand down either as ignored (CI under
    ``nohup``, a shell's background job), and the project keeps a signal its parent ignores ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start_score_worker(env: dict[str, str], *args: str) -> ForkedProcess:
    """``grpo-curator score-worker ARGS`` with ``env`` (its whole environment), forked from the server zygote
    (it preloads ``service.worker.main``: ~2.5 s of CPU per start saved) in a session of its own, as
    ``Popen(..., start_new_session=True)`` starts it: ``os.killpg(proc.pid, SIGKILL)`` kills it and its pool's
    forkserver, as an OOM kill or an operator's kill -9 would (the verifier processes lead process groups of
    their own and die by their parent-death signal). Its output goes to /dev/null."""
    return server_zygote().spawn(["score-worker", *args], env, stdout=False, stderr=False, new_session=True)


def stop_server(server: LiveServer) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture(scope="module")
def scorer() -> Iterator:
    """One real Scorer (a killable process pool) per test module."""
    from reward_models.scoring import Scorer

    with Scorer(processes=1, timeout_s=20) as s:
        yield s


@contextlib.contextmanager
def committing_client(url: str) -> Iterator:
    """TestClient over ``url`` whose requests really commit (the worker reads them); ``.factory`` is a
    session factory on the same database for the worker."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.store.db import get_engine, make_sessionmaker

    with TestClient(create_app(database_url=url)) as c:
        c.factory = make_sessionmaker(get_engine(url))
        yield c


@pytest.fixture
def api(fresh_db: str) -> Iterator:
    """``committing_client`` over a fresh database."""
    with committing_client(fresh_db) as c:
        yield c


@pytest.fixture
def fresh_api(fresh_db: str) -> Iterator:
    """The same as ``api``, for modules whose own ``api`` fixture is something else."""
    with committing_client(fresh_db) as c:
        yield c


@pytest.fixture
def live_server(fresh_db: str) -> Iterator[LiveServer]:
    server = start_server(fresh_db)
    yield server
    stop_server(server)
