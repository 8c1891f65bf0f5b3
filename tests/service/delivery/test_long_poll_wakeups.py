"""Wake-ups of long polls: a group that becomes ready reaches a poll that can take it, past polls whose token
budget or dataset scope cannot (one NOTIFY, one chain of attempts; real uvicorn servers, real HTTP)."""

from __future__ import annotations

import threading
import time

import httpx
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from service.auth import keys
from tests.conftest import start_server, stop_server
from tests.helpers import make_group
from tests.service.delivery.helpers import mark_ready

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
