"""/healthz stays bounded while the database is stalled (issue 26 follow-up): a check that gets no answer
within ``readyz_timeout_s`` is answered 503 at that timeout; cancelling its query against the stalled server
(psycopg waits seconds for that) happens in the background, never in the request."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import make_url


class FakeStallingProxy:
    """A TCP proxy in front of PostgreSQL that forwards bytes until ``stall()``: then it stops forwarding
    both ways and accepts new connections without serving them (a stalled server, a partition)."""

    def __init__(self, upstream: tuple[str, int] | str) -> None:
        self.upstream = upstream
        self.forwarding = threading.Event()
        self.forwarding.set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self) -> None:
        self.forwarding.clear()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self._sockets.append(client)
            if not self.forwarding.is_set():
                continue  # accepted, never served
            if isinstance(self.upstream, str):  # a unix socket
                server = socket.socket(socket.AF_UNIX)
                server.connect(self.upstream)
            else:
                server = socket.create_connection(self.upstream)
            self._sockets.append(server)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                while not self.forwarding.is_set():  # stalled: hold the bytes
                    if self._closed:
                        return
                    time.sleep(0.05)
                dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self._closed = True
        self.forwarding.set()
        for s in [self.listener, *self._sockets]:
            try:
                s.close()
            except OSError:
                pass


@contextmanager
def fake_stalling_proxy(url: str) -> Iterator[tuple[FakeStallingProxy, str]]:
    u = make_url(url)
    socket_dir = u.query.get("host") or (u.host if (u.host or "").startswith("/") else None)
    port = u.port or int(u.query.get("port") or 5432)
    proxy = FakeStallingProxy(f"{socket_dir}/.s.PGSQL.{port}" if socket_dir else (u.host or "127.0.0.1", port))
    try:
        query = {k: v for k, v in u.query.items() if k not in ("host", "port")}
        yield proxy, u.set(host="127.0.0.1", port=proxy.port, query=query).render_as_string(hide_password=False)
    finally:
        proxy.close()


def test_healthz_answers_503_at_its_timeout_while_the_database_is_stalled(fresh_db: str) -> None:
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings
    from service.store.db import dispose_engine

    with fake_stalling_proxy(fresh_db) as (proxy, url):
        app = create_app(Settings(database_url=url, embedded_worker=False, healthz_fresh_s=0, readyz_timeout_s=2),
                         database_url=url)
        try:
            with TestClient(app) as c:
                deadline = time.monotonic() + 30
                while (r := c.get("/healthz")).status_code != 200 and time.monotonic() < deadline:
                    time.sleep(0.2)  # a loaded machine: the first connection through the proxy may be slow
                assert r.status_code == 200, r.text
                proxy.stall()
                time.sleep(3.5)  # past the recent result's stale_s (0 + 2 + 1 s): the next call awaits a check
                started = time.monotonic()
                r = c.get("/healthz")
                took = time.monotonic() - started
                assert r.status_code == 503 and "no answer within 2 s" in r.json()["error"], r.text
                # the documented bound (readyz_timeout_s) + slack; awaiting psycopg's cancel took 2 + 5 s
                assert took < 4.5, took
        finally:
            dispose_engine(url)
            dispose_engine(fresh_db)
