"""Long polls against a live server: waiters hold no pooled connection, the waiter cap answers 429 with
Retry-After, a group that becomes ready wakes a waiter (through NOTIFY), /healthz and ingest stay served.

The server runs with a 4-connection pool and no overflow: before waiting moved out of the pool, 100
waiters drained a 30-connection pool into 500s.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from sqlalchemy import create_engine, text

from tests.conftest import start_server, stop_server
from tests.helpers import make_group
from tests.service.delivery.helpers import mark_ready

N_POLLS = 300
CAP = 120
WAIT_S = 12.0


async def _poll(http: httpx.AsyncClient, i: int) -> httpx.Response:
    body = {"trainer_id": f"t{i}", "max_groups": 1, "wait_seconds": WAIT_S}
    return await http.post("/v1/batches/lease", json=body, timeout=WAIT_S + 30)


async def _wait_until(pred, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def _scenario(url: str, db_url: str) -> dict:
    limits = httpx.Limits(max_connections=N_POLLS + 20, max_keepalive_connections=N_POLLS + 20)
    fresh = httpx.Limits(max_keepalive_connections=0)  # the pollers' idle connections may be closing
    engine = create_engine(db_url)
    async with httpx.AsyncClient(base_url=url, limits=limits) as http, httpx.AsyncClient(
        base_url=url, limits=fresh
    ) as other:
        assert (await other.post("/v1/groups", json=make_group("lp-0", n=2))).status_code == 201
        polls = [asyncio.ensure_future(_poll(http, i)) for i in range(N_POLLS)]
        await _wait_until(lambda: sum(p.done() for p in polls) >= N_POLLS - CAP, 20)
        refused = sum(p.done() for p in polls)
        mark_ready(engine, ["lp-0"])
        first = await asyncio.wait_for(next_success(polls), WAIT_S)
        with engine.connect() as conn:
            conns = conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
            ).scalar_one()
        still_waiting = sum(not p.done() for p in polls)
        health = [await other.get("/healthz", timeout=10) for _ in range(20)]
        ingest = await other.post("/v1/groups", json=make_group("lp-1", n=2), timeout=10)
        answers = await asyncio.gather(*polls)
    engine.dispose()
    return {"answers": answers, "refused": refused, "health": health, "ingest": ingest,
            "conns": conns, "first": first, "still_waiting": still_waiting}


async def next_success(polls: list) -> httpx.Response:
    while True:
        for p in polls:
            if p.done() and p.result().status_code == 200:
                return p.result()
        await asyncio.sleep(0.02)


def test_300_long_polls_with_a_low_cap_get_429s_and_no_5xx(make_db):
    env = {
        "GRPO_CURATOR_LEASE_MAX_WAITERS": str(CAP),
        "GRPO_CURATOR_DB_POOL_SIZE": "4",
        "GRPO_CURATOR_DB_MAX_OVERFLOW": "0",
        "GRPO_CURATOR_LEASE_WAIT_CHECK_S": "30",  # only a notification can wake a waiter in time
    }
    server = start_server(make_db(), env=env)
    try:
        out = asyncio.run(_scenario(server.url, server.db_url))
    finally:
        stop_server(server)
    codes = [r.status_code for r in out["answers"]]
    assert not [c for c in codes if c >= 500]
    assert codes.count(429) == N_POLLS - CAP == out["refused"]
    too_many = next(r for r in out["answers"] if r.status_code == 429)
    assert int(too_many.headers["Retry-After"]) >= 1 and "wait_seconds" in too_many.json()["error"]
    assert codes.count(200) == 1 and codes.count(204) == CAP - 1
    assert [g["id"] for g in out["first"].json()["groups"]] == ["lp-0"]
    assert all(r.status_code == 200 for r in out["health"]) and out["ingest"].status_code == 201
    # while ~CAP requests still waited: the pool (4), the listener's own connection and the health probe's
    # (one, kept and reused: service/observability/probes.py), none per waiter
    assert out["still_waiting"] > CAP // 2 and out["conns"] <= 4 + 2


def test_with_no_waiters_admitted_only_waiting_polls_are_refused_and_the_client_retries_them(make_db):
    from service.client import CuratorClient, CuratorError

    server = start_server(make_db(), env={"GRPO_CURATOR_LEASE_MAX_WAITERS": "0"})
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            lease = {"trainer_id": "t", "max_groups": 1}
            assert http.post("/v1/batches/lease", json={**lease, "wait_seconds": 0}).status_code == 204
            refused = http.post("/v1/batches/lease", json={**lease, "wait_seconds": 5})
            assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
            assert http.post("/v1/groups", json=make_group("cap-0", n=2)).status_code == 201
            engine = create_engine(server.db_url)
            mark_ready(engine, ["cap-0"])
            engine.dispose()
            # something is ready: the first attempt leases it, no waiting, no 429
            got = http.post("/v1/batches/lease", json={**lease, "wait_seconds": 5})
            assert got.status_code == 200 and got.json()["groups"][0]["id"] == "cap-0"
        sent: list[str] = []
        hook = {"request": [lambda r: sent.append(r.url.path)]}
        with CuratorClient(server.url) as c:
            c._http.event_hooks = hook
            try:
                list(c.batches("t", max_batches=1, max_groups=1, wait_seconds=5, retries=2, backoff_s=0.01))
            except CuratorError as exc:
                assert exc.status_code == 429
            else:
                raise AssertionError("a 429 on every try must surface after the retries")
        assert sent.count("/v1/batches/lease") == 3  # 429 is retried like a 5xx
    finally:
        stop_server(server)
