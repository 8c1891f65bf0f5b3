"""Long polls against a live server: waiters hold no pooled connection, the waiter cap answers 429 with
Retry-After, a group that becomes ready wakes a waiter (through NOTIFY), /healthz and ingest stay served.

The server runs with a 4-connection pool and no overflow: before waiting moved out of the pool, 100
waiters drained a 30-connection pool into 500s.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from service.auth import keys
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
    # while ~CAP requests still waited: the pool (4) and the listener's own connection, none per waiter
    assert out["still_waiting"] > CAP // 2 and out["conns"] <= 4 + 1


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


# ---------------------------------------------------------------------------------------------------
# 1. lost wake-ups: a budget that skips a group is treated as "nothing is ready"


def _lease(url: str, body: dict, out: dict, key: str) -> None:
    with httpx.Client(base_url=url, timeout=90) as http:
        start = time.monotonic()
        out[key] = http.post("/v1/batches/lease", json=body)
        out[key + "_s"] = time.monotonic() - start


# Attack: a poll whose budget skipped the ready group marked 'nothing ready': a poll that could take it waited to a 204.
def test_a_ready_group_reaches_a_fresh_poll_even_after_a_small_budget_poll_found_it_too_big(make_db):
    """Group ready before anyone polls. Two pollers with max_tokens=1 (the group alone is over their
    budget: skipped) wait; then a poll that CAN take the group arrives. It must get it, not a 204."""
    server = start_server(make_db(), env={"GRPO_CURATOR_LEASE_WAIT_CHECK_S": "30"})
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.post("/v1/groups", json=make_group("big-0", n=2)).status_code == 201
        engine = create_engine(server.db_url)
        mark_ready(engine, ["big-0"])
        engine.dispose()
        out: dict = {}
        tiny = {"max_tokens": 1, "wait_seconds": 20}
        threads = []
        for i in range(2):
            t = threading.Thread(target=_lease, args=(server.url, {"trainer_id": f"tiny{i}", **tiny}, out, f"tiny{i}"))
            t.start()
            threads.append(t)
            time.sleep(1.0)  # the first starts the listener; the second's empty attempt marks "nothing ready"
        _lease(server.url, {"trainer_id": "real", "max_groups": 1, "wait_seconds": 5}, out, "real")
        for t in threads:
            t.join()
    finally:
        stop_server(server)
    _delivered_once(out, "big-0")


def _delivered_once(out: dict, group_id: str) -> None:
    """The group reached exactly one poll. (A first group over a poll's budget is delivered alone, so a
    small-budget poll may be the one that takes it; what must not happen is every poll getting 204.)"""
    got = {k: v for k, v in out.items() if not k.endswith("_s") and v.status_code == 200}
    codes = {k: v.status_code for k, v in out.items() if not k.endswith("_s")}
    assert len(got) == 1, f"a ready group was delivered to {len(got)} polls: {codes}"
    (batch,) = got.values()
    assert [g["id"] for g in batch.json()["groups"]] == [group_id]


# Attack: the wake-up chain ended at small-budget waiters; a waiter that could take the group never woke.
def test_a_notification_reaches_a_waiter_that_can_take_the_group_behind_small_budget_waiters(make_db):
    """Waiters: max_tokens=1 first, then one that can take the group. The group becomes ready (NOTIFY):
    the wake-up goes to the small one, which skips the group and ends the chain; the real waiter sleeps."""
    server = start_server(make_db(), env={"GRPO_CURATOR_LEASE_WAIT_CHECK_S": "30"})
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.post("/v1/groups", json=make_group("big-1", n=2)).status_code == 201
        out: dict = {}
        tiny = threading.Thread(
            target=_lease, args=(server.url, {"trainer_id": "tiny", "max_tokens": 1, "wait_seconds": 15}, out, "tiny")
        )
        tiny.start()
        time.sleep(1.0)
        real = threading.Thread(
            target=_lease, args=(server.url, {"trainer_id": "real", "max_groups": 1, "wait_seconds": 8}, out, "real")
        )
        real.start()
        time.sleep(1.0)
        engine = create_engine(server.db_url)
        mark_ready(engine, ["big-1"])  # the trigger notifies: one wake-up
        engine.dispose()
        real.join()
        tiny.join()
    finally:
        stop_server(server)
    _delivered_once(out, "big-1")


# 1b. the same lost wake-up through a filter the poll's body does not show: a dataset-scoped key


def _scoped_server(make_db) -> tuple:
    db = make_db()
    server = start_server(db, env={"GRPO_CURATOR_LEASE_WAIT_CHECK_S": "30"})
    tokens = keys.provision(db, {"p": "producer", "t": "trainer"})
    with Session(create_engine(db)) as s, s.begin():
        tokens["scoped"] = keys.create_key(s, "scoped", "trainer", ["elsewhere"])
    return server, tokens


def _lease_as(url: str, token: str, body: dict, out: dict, name: str) -> threading.Thread:
    def run() -> None:
        with httpx.Client(base_url=url, timeout=90, headers={"Authorization": f"Bearer {token}"}) as http:
            start = time.monotonic()
            out[name] = http.post("/v1/batches/lease", json=body)
            out[name + "_s"] = time.monotonic() - start

    thread = threading.Thread(target=run)
    thread.start()
    return thread


# Attack: a dataset-scoped key's empty poll marked 'nothing ready' for every other waiter.
def test_a_scoped_keys_empty_poll_does_not_mark_nothing_ready(make_db) -> None:
    """A ready group in dataset 'toy'; a poll with a key scoped to another dataset finds nothing and
    waits. A fresh poll with an unscoped key must still query (and lease), not trust 'nothing ready'."""
    server, tokens = _scoped_server(make_db)
    try:
        with httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {tokens['p']}"}) as http:
            assert http.post("/v1/groups", json=make_group("toy-0", n=2)).status_code == 201
        engine = create_engine(server.db_url)
        mark_ready(engine, ["toy-0"])
        engine.dispose()
        out: dict = {}
        scoped = []
        for i in range(2):  # the first starts the listener; the second's empty attempt is the one judged
            body = {"trainer_id": f"s{i}", "max_groups": 1, "wait_seconds": 8}
            scoped.append(_lease_as(server.url, tokens["scoped"], body, out, f"scoped{i}"))
            time.sleep(1.0)
        _lease_as(server.url, tokens["t"], {"trainer_id": "real", "max_groups": 1, "wait_seconds": 5}, out, "real").join()
        for t in scoped:
            t.join()
    finally:
        stop_server(server)
    assert out["scoped0"].status_code == out["scoped1"].status_code == 204
    assert out["real"].status_code == 200, f"ready group not delivered: {out['real'].status_code} after {out['real_s']:.1f}s"


# Attack: one NOTIFY woke only a scoped waiter that could not lease the group; the unscoped waiter slept.
def test_a_notification_goes_past_a_scoped_waiter_to_one_that_can_lease(make_db) -> None:
    """Waiters: a dataset-scoped one first, then an unscoped one. The group becomes ready (one NOTIFY):
    the scoped waiter sees nothing and must pass the wake-up on."""
    server, tokens = _scoped_server(make_db)
    try:
        with httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {tokens['p']}"}) as http:
            assert http.post("/v1/groups", json=make_group("toy-1", n=2)).status_code == 201
        out: dict = {}
        scoped = _lease_as(server.url, tokens["scoped"], {"trainer_id": "s", "max_groups": 1, "wait_seconds": 12}, out, "scoped")
        time.sleep(1.0)
        real = _lease_as(server.url, tokens["t"], {"trainer_id": "real", "max_groups": 1, "wait_seconds": 8}, out, "real")
        time.sleep(1.0)
        engine = create_engine(server.db_url)
        mark_ready(engine, ["toy-1"])
        engine.dispose()
        real.join()
        scoped.join()
    finally:
        stop_server(server)
    assert out["real"].status_code == 200, f"the waiter that could lease got {out['real'].status_code} after {out['real_s']:.1f}s"
    assert out["real_s"] < 7.0  # woken by the notification's chain, not by the end of its own wait
