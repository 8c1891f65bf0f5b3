"""CuratorClient's delivery calls and the ``batches`` stream against the service under uvicorn.

Network faults are injected by ``FakeLossyNetwork``, an httpx transport standing in for a flaky
network between the client and the real server: it can drop an answer after the server handled the
request (the case a retried request_id exists for) or answer 503 like a proxy whose backend is down.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from sqlalchemy import Engine, create_engine, text

from service.client import CuratorClient, CuratorError
from tests.conftest import LiveServer, start_server, stop_server
from tests.service.delivery.helpers import expire_now, group_ids, reset, seed_ready


class FakeLossyNetwork(httpx.BaseTransport):
    """Real HTTP to the server, except: the first ``lose`` answers to matching requests are lost after the
    server handled them (ReadError), and the first ``unavailable`` matching requests get a 503 without
    reaching the server."""

    def __init__(self, path: str, *, lose: int = 0, unavailable: int = 0) -> None:
        self.inner = httpx.HTTPTransport()
        self.path, self.lose, self.unavailable = path, lose, unavailable
        self.sent: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request.url.path)
        if request.url.path.endswith(self.path) and self.unavailable > 0:
            self.unavailable -= 1
            return httpx.Response(503, json={"error": "upstream unavailable"}, request=request)
        response = self.inner.handle_request(request)
        if request.url.path.endswith(self.path) and self.lose > 0:
            self.lose -= 1
            response.read()
            raise httpx.ReadError("connection reset by peer", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def server(make_db) -> Iterator[LiveServer]:
    live = start_server(make_db())
    yield live
    stop_server(live)


@pytest.fixture
def db(server: LiveServer) -> Iterator[Engine]:
    engine = create_engine(server.db_url)
    reset(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def api(server: LiveServer, db: Engine) -> Iterator[CuratorClient]:
    with CuratorClient(server.url) as c:
        yield c


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


class TestCalls:
    def test_lease_ack_nack_get(self, api, http, db):
        ids = seed_ready(http, db, 3, prefix="c")
        batch = api.lease("t0", max_groups=2, lease_seconds=60)
        assert group_ids(batch) == ids[:2] and batch["trainer_id"] == "t0"
        assert api.get_batch(batch["batch_id"])["status"] == "active"
        arrow = api.lease("t1", max_groups=5, format="arrow")
        assert group_ids(arrow) == ids[2:]
        assert api.ack(batch["batch_id"])["status"] == "acked"
        assert api.nack(arrow["batch_id"])["status"] == "nacked"
        assert api.lease("t1", max_groups=5, wait_seconds=0) is not None
        assert api.lease("t1", max_groups=5) is None  # 204
        with pytest.raises(CuratorError) as err:
            api.ack(arrow["batch_id"])
        assert err.value.status_code == 409

    def test_arrow_numpy_views(self, api, http, db):
        seed_ready(http, db, 1, prefix="np")
        batch = api.lease("t0", max_groups=1, format="arrow", as_numpy=True)
        t = batch["groups"][0]["trajectories"][0]
        assert isinstance(t["token_ids"], np.ndarray) and t["logprobs"].dtype == np.float32

    def test_unknown_format_lists_the_valid_ones(self, api):
        with pytest.raises(ValueError, match="json, arrow"):
            api.lease("t0", max_groups=1, format="parquet")  # type: ignore[arg-type]

    def test_policy_calls(self, api, db):
        assert api.get_policy()["version"] == 0
        assert api.publish_policy(1, {"loss": 0.5})["version"] == 1
        assert api.publish_policy(1, {"loss": 0.5})["metrics"] == {"loss": 0.5}  # idempotent retry
        with pytest.raises(CuratorError) as err:
            api.publish_policy(0, {})
        assert err.value.status_code == 409 and "version" in err.value.message
        assert [v["version"] for v in api.policy_history()["versions"]] == [1]


class TestBatchStream:
    def test_acks_each_batch_after_the_block(self, api, http, db):
        ids = seed_ready(http, db, 6, prefix="it")
        seen = []
        stream = api.batches("t0", max_batches=2, max_groups=2)
        for batch in stream:
            seen += group_ids(batch)
        assert seen == ids[:4] and len(stream.acked) == 2
        assert count(db, "SELECT count(*) FROM groups WHERE status = 'consumed'") == 4
        assert count(db, "SELECT count(*) FROM leases WHERE status = 'acked'") == 2

    def test_stops_when_empty(self, api, http, db):
        seed_ready(http, db, 5, prefix="se")
        batches = list(api.batches("t0", stop_when_empty=True, max_groups=2))
        assert [len(b["groups"]) for b in batches] == [2, 2, 1]
        assert count(db, "SELECT count(*) FROM groups WHERE status = 'consumed'") == 5

    def test_an_exception_in_the_block_nacks(self, api, http, db):
        ids = seed_ready(http, db, 2, prefix="ex")
        with pytest.raises(RuntimeError, match="step failed"):
            with api.batches("t0", max_groups=2) as stream:
                for _ in stream:
                    raise RuntimeError("step failed")
        assert len(stream.nacked) == 1 and stream.acked == []
        assert count(db, "SELECT count(*) FROM groups WHERE status = 'ready'") == 2
        assert group_ids(api.lease("t1", max_groups=5)) == ids  # delivered again

    def test_an_exception_without_with_nacks_too(self, api, http, db):
        seed_ready(http, db, 2, prefix="ex2")
        stream = api.batches("t0", max_groups=1)
        with pytest.raises(RuntimeError):
            for _ in stream:
                raise RuntimeError("step failed")
        assert len(stream.nacked) == 1
        assert count(db, "SELECT count(*) FROM leases WHERE status = 'nacked'") == 1

    def test_break_inside_with_acks(self, api, http, db):
        seed_ready(http, db, 3, prefix="br")
        with api.batches("t0", max_groups=1) as stream:
            for _ in stream:
                break
        assert len(stream.acked) == 1 and stream.nacked == []
        assert count(db, "SELECT count(*) FROM groups WHERE status = 'consumed'") == 1

    def test_a_refused_ack_is_recorded_not_raised(self, api, http, db):
        seed_ready(http, db, 1, prefix="rf")
        with api.batches("slow", max_batches=1, max_groups=1) as stream:
            for batch in stream:
                expire_now(db, batch["batch_id"])  # the step took longer than the lease ...
                taken = api.lease("fast", max_groups=1)  # ... and another trainer got the group
        assert stream.refused == [batch["batch_id"]] and stream.acked == []
        api.ack(taken["batch_id"])
        assert count(db, "SELECT count(*) FROM groups WHERE status = 'consumed'") == 1


class TestRetries:
    def test_a_lost_lease_answer_is_retried_with_the_same_request_id(self, server, http, db):
        ids = seed_ready(http, db, 4, prefix="lost")
        network = FakeLossyNetwork("/v1/batches/lease", lose=1)
        with CuratorClient(server.url, transport=network) as c:
            stream = c.batches("t0", max_batches=1, max_groups=2, backoff_s=0.01)
            batches = list(stream)
        assert network.sent.count("/v1/batches/lease") == 2
        assert batches[0]["stats"]["replayed"] is True and group_ids(batches[0]) == ids[:2]
        assert count(db, "SELECT count(*) FROM leases") == 1  # the lost answer did not cost a second lease
        assert stream.acked == [batches[0]["batch_id"]]
        assert count(db, "SELECT count(*) FROM groups WHERE status = 'consumed'") == 2

    def test_5xx_and_lost_acks_are_retried(self, server, http, db):
        seed_ready(http, db, 2, prefix="unav")
        lease_net = FakeLossyNetwork("/v1/batches/lease", unavailable=2)
        with CuratorClient(server.url, transport=lease_net) as c:
            assert len(list(c.batches("t0", max_batches=1, max_groups=1, backoff_s=0.01))) == 1
        assert lease_net.sent.count("/v1/batches/lease") == 3
        ack_net = FakeLossyNetwork("/ack", lose=1)
        with CuratorClient(server.url, transport=ack_net) as c:
            stream = c.batches("t0", max_batches=1, max_groups=1, backoff_s=0.01)
            list(stream)
        assert len(stream.acked) == 1 and sum(p.endswith("/ack") for p in ack_net.sent) == 2
        assert count(db, "SELECT count(*) FROM groups WHERE status = 'consumed'") == 2

    def test_client_errors_are_not_retried(self, server, db):
        network = FakeLossyNetwork("/none")
        with CuratorClient(server.url, transport=network) as c:
            with pytest.raises(CuratorError) as err:
                list(c.batches("t0", max_batches=1, max_groups=1, max_tokens=5))
        assert err.value.status_code == 422 and len(network.sent) == 1

    def test_gives_up_after_the_retries(self, server, db):
        network = FakeLossyNetwork("/v1/batches/lease", unavailable=10)
        with CuratorClient(server.url, transport=network) as c:
            with pytest.raises(CuratorError) as err:
                list(c.batches("t0", max_batches=1, max_groups=1, retries=2, backoff_s=0.01))
        assert err.value.status_code == 503 and len(network.sent) == 3


def test_the_shared_tls_context_follows_ssl_cert_file(monkeypatch):
    """One context a process while SSL_CERT_FILE / SSL_CERT_DIR stay as they are; set later, they are read again
    (helper-40: a CA bundle named after the first client was ignored, while a plain httpx client honoured it)."""
    import certifi

    from service.client import tls_context

    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    first = tls_context()
    assert tls_context() is first
    monkeypatch.setenv("SSL_CERT_FILE", certifi.where())
    assert tls_context() is not first
    monkeypatch.delenv("SSL_CERT_FILE")
    assert tls_context() is first
