"""Against uvicorn in a subprocess (real HTTP): ids with '/', '#', '%' through the Python client, and
the database going away (503 JSON with Retry-After; the client waits and retries)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from service.client import CuratorClient, CuratorError
from tests.conftest import LiveServer, start_server, stop_server
from tests.helpers import make_group


class FakePostgresProxy:
    """A TCP relay in front of the real PostgreSQL that can be switched off: while down it closes every
    relayed connection and refuses new ones (what a crashed or restarting database looks like)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.up = True
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def down(self) -> None:
        self.up = False
        with self._lock:
            for s in self._open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._open.clear()

    def close(self) -> None:
        self.down()
        self._listener.close()


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


@pytest.fixture(scope="module")
def proxied(make_db) -> Iterator[tuple[LiveServer, FakePostgresProxy]]:
    url = make_db()
    target = urlsplit(url)
    proxy = FakePostgresProxy((target.hostname or "127.0.0.1", target.port or 5432))
    server = start_server(_via(url, proxy.port))
    yield server, proxy
    stop_server(server)
    proxy.close()


class TestIdsThroughTheClient:
    @pytest.mark.parametrize("gid", ["HumanEval/0", "a#b", "a%2Fb", "q?x=1&y", "..", "a/../b", "sp ace"])
    def test_group_ids(self, proxied, gid):
        server, _ = proxied
        with CuratorClient(server.url) as api:
            api.post_group(make_group(gid, prompt_id=f"p/{gid}"))
            got = api.get_group(gid)
        assert (got["id"], got["prompt_id"]) == (gid, f"p/{gid}")

    def test_dataset_and_spec_names(self, proxied):
        server, _ = proxied
        with CuratorClient(server.url) as api:
            api.create_reward_spec({"name": "team/exact#1", "components": [{"name": "m", "kind": "verifier.exact_match"}]})
            assert api.get_reward_spec("team/exact#1")["version"] == 1
            assert api.set_dataset("openai/gsm8k", reward_spec="team/exact#1")["name"] == "openai/gsm8k"
            with httpx.Client(base_url=server.url) as http:
                assert http.get("/v1/datasets/openai%2Fgsm8k").json()["reward_spec"] == "team/exact#1"
            with pytest.raises(CuratorError) as err:
                api.get_group("no#such")
        assert err.value.status_code == 404 and "no#such" in err.value.message


def _until_healthz_says_down(http: httpx.Client) -> None:
    """/healthz answers from its last background check while that is younger than ``healthz_fresh_s`` (1 s),
    never older than fresh + ``readyz_timeout_s`` (2 s) + 1 s (service/observability/health.py): a database
    that just went down is reported within that bound, not at once. /readyz asks the database itself."""
    deadline = time.monotonic() + 1 + 2 + 1 + 2  # the bound, plus slack for a loaded machine
    while http.get("/healthz").status_code == 200:
        assert time.monotonic() < deadline, "/healthz still says ok past its staleness bound"
        time.sleep(0.1)


class TestDatabaseDown:
    def test_503_json_with_retry_after_then_the_client_recovers(self, proxied):
        server, proxy = proxied
        proxy.down()
        try:
            with httpx.Client(base_url=server.url, timeout=30) as http:
                _until_healthz_says_down(http)
                answers = [
                    http.get("/healthz"),
                    http.get("/readyz"),
                    http.post("/v1/groups", json=make_group("down-1", prompt_id="down-p")),
                    http.get("/v1/groups/down-1"),
                    http.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 1}),
                ]
            for r in answers:
                assert r.status_code == 503, r.text
                assert r.headers["content-type"] == "application/json" and int(r.headers["retry-after"]) >= 1
                assert r.json()["error"].startswith("database: unavailable")
            result: dict[str, object] = {}

            def post() -> None:
                with CuratorClient(server.url) as api:
                    result["ack"] = api.post_group(make_group("down-2", prompt_id="down-p2"))

            started = time.monotonic()
            worker = threading.Thread(target=post)
            worker.start()
            time.sleep(1.5)  # the client has had at least one 503 and is waiting to retry
        finally:
            proxy.up = True
        worker.join(timeout=60)
        assert result["ack"] == {"id": "down-2", "status": "received", "trajectories": 4, "created": True}
        assert time.monotonic() - started >= 1.5
        with CuratorClient(server.url) as api:
            assert api.get_group("down-2")["status"] in ("received", "scored", "ready")
            with pytest.raises(CuratorError):
                api.get_group("down-1")  # the request answered 503 stored nothing

    def test_a_client_gives_up_after_its_retries(self, proxied):
        server, proxy = proxied
        proxy.down()
        try:
            with httpx.Client(base_url=server.url, timeout=30) as http:
                _until_healthz_says_down(http)
            with CuratorClient(server.url, unavailable_retries=2, max_retry_after_s=0.1) as api:
                with pytest.raises(CuratorError) as err:
                    api.health()
        finally:
            proxy.up = True
        assert err.value.status_code == 503


# Attack: a statement PostgreSQL refuses (too many parameters) was reported as 'database unavailable' (503).
def test_only_connection_failures_count_as_unavailable(engine):
    """Real exceptions: a statement PostgreSQL refuses (too many parameters) is not "unavailable";
    a connection refused is."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import DBAPIError

    from service.api.errors import _is_db_unavailable
    from tests.conftest import free_port

    params = {f"p{i}": i for i in range(70_000)}
    sql = text("SELECT 1 WHERE 1 IN (" + ", ".join(f":p{i}" for i in range(70_000)) + ")")
    with pytest.raises(DBAPIError) as too_many, engine.connect() as conn:
        conn.execute(sql, params)
    assert not _is_db_unavailable(too_many.value), too_many.value
    with pytest.raises(DBAPIError) as refused:
        create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x").connect()
    assert _is_db_unavailable(refused.value), refused.value


# helper-35 F2: a deadlock between two requests was a 500; PostgreSQL cancelled one transaction, nothing of it
# stored, and the same request succeeds when sent again
@pytest.mark.parametrize("sqlstate", ["40P01", "40001", "55P03", "57014"])
def test_a_transaction_cancelled_for_a_concurrent_one_is_a_503_to_retry(engine, sqlstate):
    """Real exceptions raised by PostgreSQL with the SQLSTATE it gives a deadlock victim, a serialization
    failure, a lock timeout and a cancelled statement (helper-40: a pg_cancel_backend or lock_timeout of a waiting
    ingest was a 500): a 503 with Retry-After naming the SQLSTATE; a unique violation stays a bug (no 503)."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from service.api.errors import db_error_response

    def raised(code: str) -> DBAPIError:
        with pytest.raises(DBAPIError) as err, engine.connect() as conn:
            conn.execute(text(f"DO $$ BEGIN RAISE EXCEPTION 'cancelled' USING ERRCODE = '{code}'; END $$"))
        return err.value

    response = db_error_response(raised(sqlstate))
    assert response is not None and response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert f"SQLSTATE {sqlstate}" in response.body.decode()
    assert db_error_response(raised("23505")) is None


def test_an_idle_connection_outlives_the_clients_keep_alive(proxied):
    """A connection left idle past httpx's / the openai SDK's 5 s expiry is still open: the client always
    drops it first. With uvicorn's default 5 s both ends closed at the same moment, and a request sent in that
    instant failed with ReadError (bench.gateway: ~1 call in 2,000 at 64 concurrent sessions)."""
    import socket
    import time

    server, _ = proxied
    port = int(server.url.rsplit(":", 1)[1])
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

    def answered(sock: socket.socket) -> bytes:
        """One whole response (headers and its content-length of body; the body may come in a packet of its
        own, and must not be left for the next read), or what came before the server closed."""
        data = b""
        while True:
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                               if line.lower().startswith(b"content-length:")), 0)
                if len(body) >= length:
                    return data
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        assert answered(sock).startswith(b"HTTP/1.1 ")
        time.sleep(6.0)  # the behaviour is the idle time itself: past 5 s
        sock.sendall(request)
        assert answered(sock).startswith(b"HTTP/1.1 "), "the server closed the idle connection"


def test_serve_raises_its_open_files_limit_to_the_hard_one(make_db):
    """Idle keep-alive connections hold a descriptor each for 75 s: `serve` started under a soft limit of 256
    runs with the hard limit (helper-40: under 1,024, ~1,000 idle clients made it drop every new connection)."""
    import resource
    import subprocess
    import sys

    from service.client import wait_healthy
    from tests.conftest import ROOT, free_port

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    port = free_port()
    env = {**os.environ, "DATABASE_URL": make_db(), "GRPO_CURATOR_EMBEDDED_WORKER": "false",
           "GRPO_CURATOR_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)))
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        line = next(x for x in open(f"/proc/{proc.pid}/limits").read().splitlines() if x.startswith("Max open files"))
        soft_now = line.split()[3]
        if hard == resource.RLIM_INFINITY:
            assert soft_now != "256", line
        else:
            assert soft_now == str(hard), line
    finally:
        proc.terminate()
        proc.wait(timeout=30)
