"""Wake-ups of long polls: a group that becomes ready reaches a poll that can take it, past polls whose token
budget or dataset scope cannot (one NOTIFY, one chain of attempts; a real uvicorn server, real HTTP).

The module's tests share one server (``server``): each starts from emptied tables (``reset``), with its own
group and trainer ids, after the previous test's polls have all been answered. Keys are on: a producer, an
unscoped trainer, and a trainer key scoped to another dataset. The periodic re-check is 30 s, longer than
any poll here, so only a notification's chain can wake a waiter in time.

The waits are sized to the scenario, not padded: a poll that must still wait when a later step happens waits
a few seconds past that step (the steps are 1 s apart), and the poll that must be served has a deadline that
a lost wake-up would run into (its 204, or its time, is what the test judges).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from service.auth import keys
from service.store.db import dispose_engine
from tests.conftest import start_server, stop_server
from tests.helpers import make_group
from tests.service.delivery.helpers import mark_ready, reset


class _Server:
    def __init__(self, live: Any, tokens: dict[str, str]) -> None:
        self.url, self.db_url, self.tokens = live.url, live.db_url, tokens
        self.engine = create_engine(live.db_url)


@pytest.fixture(scope="module")
def shared(make_db) -> Iterator[_Server]:
    db = make_db()
    tokens = keys.provision(db, {"p": "producer", "t": "trainer"})
    engine = create_engine(db)
    with Session(engine) as s, s.begin():
        tokens["scoped"] = keys.create_key(s, "scoped", "trainer", ["elsewhere"])
    engine.dispose()
    dispose_engine(db)
    live = start_server(db, env={"GRPO_CURATOR_LEASE_WAIT_CHECK_S": "30"})
    server = _Server(live, tokens)
    try:
        yield server
    finally:
        stop_server(live)
        server.engine.dispose()
        make_db.retire(db)


@pytest.fixture
def server(shared: _Server) -> _Server:
    """The module's server, its groups and leases emptied (the keys stay)."""
    reset(shared.engine)
    return shared


def _post(server: _Server, group_id: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30, headers=_auth(server.tokens["p"])) as http:
        assert http.post("/v1/groups", json=make_group(group_id, n=2)).status_code == 201


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}

# ---------------------------------------------------------------------------------------------------
# 1. lost wake-ups: a budget that skips a group is treated as "nothing is ready"


def _lease(url: str, body: dict, out: dict, key: str, token: str) -> None:
    with httpx.Client(base_url=url, timeout=90, headers=_auth(token)) as http:
        start = time.monotonic()
        out[key] = http.post("/v1/batches/lease", json=body)
        out[key + "_s"] = time.monotonic() - start


# Attack: a poll whose budget skipped the ready group marked 'nothing ready': a poll that could take it waited to a 204.
def test_a_ready_group_reaches_a_fresh_poll_even_after_a_small_budget_poll_found_it_too_big(server):
    """Group ready before anyone polls. Two pollers with max_tokens=1 (the group alone is over their
    budget: skipped) wait; then a poll that CAN take the group arrives. It must get it, not a 204."""
    _post(server, "big-0")
    mark_ready(server.engine, ["big-0"])
    out: dict = {}
    # the tiny polls still wait while the real one runs (it starts 2 s in and waits at most 5 s)
    tiny = {"max_tokens": 1, "wait_seconds": 10}
    threads = []
    for i in range(2):
        body = {"trainer_id": f"tiny{i}", **tiny}
        t = threading.Thread(target=_lease, args=(server.url, body, out, f"tiny{i}", server.tokens["t"]))
        t.start()
        threads.append(t)
        time.sleep(1.0)  # the first starts the listener; the second's empty attempt marks "nothing ready"
    _lease(server.url, {"trainer_id": "real", "max_groups": 1, "wait_seconds": 5}, out, "real", server.tokens["t"])
    for t in threads:
        t.join()
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
def test_a_notification_reaches_a_waiter_that_can_take_the_group_behind_small_budget_waiters(server):
    """Waiters: max_tokens=1 first, then one that can take the group. The group becomes ready (NOTIFY):
    the wake-up goes to the small one, which skips the group and ends the chain; the real waiter sleeps."""
    _post(server, "big-1")
    out: dict = {}
    token = server.tokens["t"]
    # the tiny poll waits past the notification (2 s in) and past the real poll's deadline (1 + 6 s)
    tiny_body = {"trainer_id": "tiny", "max_tokens": 1, "wait_seconds": 8}
    tiny = threading.Thread(target=_lease, args=(server.url, tiny_body, out, "tiny", token))
    tiny.start()
    time.sleep(1.0)
    real_body = {"trainer_id": "real", "max_groups": 1, "wait_seconds": 6}
    real = threading.Thread(target=_lease, args=(server.url, real_body, out, "real", token))
    real.start()
    time.sleep(1.0)
    mark_ready(server.engine, ["big-1"])  # the trigger notifies: one wake-up
    real.join()
    tiny.join()
    _delivered_once(out, "big-1")


# 1b. the same lost wake-up through a filter the poll's body does not show: a dataset-scoped key


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
def test_a_scoped_keys_empty_poll_does_not_mark_nothing_ready(server) -> None:
    """A ready group in dataset 'toy'; a poll with a key scoped to another dataset finds nothing and
    waits. A fresh poll with an unscoped key must still query (and lease), not trust 'nothing ready'."""
    tokens = server.tokens
    _post(server, "toy-0")
    mark_ready(server.engine, ["toy-0"])
    out: dict = {}
    scoped = []
    for i in range(2):  # the first starts the listener; the second's empty attempt is the one judged
        body = {"trainer_id": f"s{i}", "max_groups": 1, "wait_seconds": 8}
        scoped.append(_lease_as(server.url, tokens["scoped"], body, out, f"scoped{i}"))
        time.sleep(1.0)
    _lease_as(server.url, tokens["t"], {"trainer_id": "real", "max_groups": 1, "wait_seconds": 5}, out, "real").join()
    for t in scoped:
        t.join()
    assert out["scoped0"].status_code == out["scoped1"].status_code == 204
    assert out["real"].status_code == 200, f"ready group not delivered: {out['real'].status_code} after {out['real_s']:.1f}s"


# Attack: one NOTIFY woke only a scoped waiter that could not lease the group; the unscoped waiter slept.
def test_a_notification_goes_past_a_scoped_waiter_to_one_that_can_lease(server) -> None:
    """Waiters: a dataset-scoped one first, then an unscoped one. The group becomes ready (one NOTIFY):
    the scoped waiter sees nothing and must pass the wake-up on."""
    tokens = server.tokens
    _post(server, "toy-1")
    out: dict = {}
    # the scoped poll is first in the queue at the notification (2 s in) and waits past it
    scoped = _lease_as(server.url, tokens["scoped"], {"trainer_id": "s", "max_groups": 1, "wait_seconds": 8}, out, "scoped")
    time.sleep(1.0)
    real = _lease_as(server.url, tokens["t"], {"trainer_id": "real", "max_groups": 1, "wait_seconds": 8}, out, "real")
    time.sleep(1.0)
    mark_ready(server.engine, ["toy-1"])
    real.join()
    scoped.join()
    assert out["real"].status_code == 200, f"the waiter that could lease got {out['real'].status_code} after {out['real_s']:.1f}s"
    assert out["real_s"] < 7.0  # woken by the notification's chain, not by the end of its own wait
