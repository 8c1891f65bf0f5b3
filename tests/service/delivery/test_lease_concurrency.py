"""Exactly-once delivery with real processes: producers, trainers, a killed trainer, racing retries.

The service runs under uvicorn (two worker processes) on its own database, one server for the module: each
test starts from emptied tables (``reset``). Groups are made ready by a marker process (test setup in place
of the curation worker, see ``tests.service.delivery.helpers.mark_ready``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from service.client import CuratorClient
from tests.conftest import ROOT, LiveServer, start_server, stop_server
from tests.service.delivery.helpers import group_ids, marker, producer, reset, seed_ready, trainer

N_PER_PRODUCER = 1050


@pytest.fixture(scope="module")
def shared_server(make_db) -> Iterator[LiveServer]:
    """One server (two uvicorn worker processes) for the module's tests."""
    server = start_server(make_db(), workers=2)
    try:
        yield server
    finally:
        stop_server(server)
        make_db.retire(server.db_url)


@pytest.fixture
def live_server(shared_server: LiveServer) -> LiveServer:
    """The module's server, its groups and leases emptied."""
    engine = create_engine(shared_server.db_url)
    reset(engine)
    engine.dispose()
    return shared_server


def _wait_all_consumed(db_url: str, total: int, timeout_s: float) -> int:
    engine = create_engine(db_url)
    deadline = time.monotonic() + timeout_s
    consumed = 0
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            consumed = conn.execute(
                text("SELECT count(*) FROM groups WHERE status = 'consumed'")
            ).scalar_one()
            conn.commit()
            if consumed == total:
                break
            time.sleep(0.2)
    engine.dispose()
    return consumed


def _db_rows(db_url: str) -> tuple[list, list]:
    engine = create_engine(db_url)
    with engine.connect() as conn:
        groups = conn.execute(text("SELECT pk, id, status, lease_id FROM groups")).all()
        leases = conn.execute(text("SELECT id, status, group_pks FROM leases")).all()
    engine.dispose()
    return groups, leases


@pytest.mark.slow
def test_exactly_once_under_four_trainers_and_two_producers(live_server, tmp_path: Path):
    server = live_server
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    outs = [str(tmp_path / f"trainer{i}.json") for i in range(4)]
    producers: list = []
    helpers: list = []
    try:
        producers = [
            ctx.Process(target=producer, args=(server.url, f"prod{i}", N_PER_PRODUCER, 50)) for i in range(2)
        ]
        helpers = [ctx.Process(target=marker, args=(server.db_url, stop))]
        helpers += [
            ctx.Process(target=trainer, args=(server.url, f"trainer{i}", stop, outs[i], i)) for i in range(4)
        ]
        for p in producers + helpers:
            p.start()
        for p in producers:
            p.join(timeout=120)
            assert p.exitcode == 0
        total = 2 * N_PER_PRODUCER
        assert _wait_all_consumed(server.db_url, total, timeout_s=90) == total
        stop.set()
        for p in helpers:
            p.join(timeout=60)
            assert p.exitcode == 0
        groups, leases = _db_rows(server.db_url)
    finally:
        stop.set()
        for p in producers + helpers:  # a failed run's leftovers must not reach the next test's tables
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)

    # the database: every group consumed, by exactly one acked lease, which is the lease it records
    assert len(groups) == total and {g.status for g in groups} == {"consumed"}
    acked = {lease.id: lease.group_pks for lease in leases if lease.status == "acked"}
    holders = Counter(pk for pks in acked.values() for pk in pks)
    assert set(holders) == {g.pk for g in groups} and set(holders.values()) == {1}
    assert all(g.lease_id in acked and g.pk in acked[g.lease_id] for g in groups)

    # the trainers: every group acked (200) exactly once across the four of them; only stalls were refused
    logs = [json.loads(Path(out).read_text()) for out in outs]
    assert [log["errors"] for log in logs] == [[], [], [], []]
    acked_ids = Counter(gid for log in logs for _, ids in log["acked"] for gid in ids)
    assert set(acked_ids) == {g.id for g in groups} and set(acked_ids.values()) == {1}
    assert sorted(batch for log in logs for batch, _ in log["acked"]) == sorted(acked)
    statuses = Counter(lease.status for lease in leases)
    assert statuses["nacked"] >= 4 and all(log["nacked"] for log in logs)  # redelivery was exercised
    # only the stalled (short) leases can expire, and each expired one had its late ack refused
    assert statuses["expired"] >= 1 and sum(len(log["refused"]) for log in logs) == statuses["expired"]
    assert statuses["acked"] + statuses["nacked"] + statuses["expired"] == len(leases)


def test_a_killed_trainer_s_groups_come_back_after_expiry(live_server):
    engine = create_engine(live_server.db_url)
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        ids = seed_ready(http, engine, 4, prefix="kill")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "tests.service.delivery.helpers", "hold", live_server.url, "doomed"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        held = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        assert held["groups"] == ids[:3]
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        delivered: dict[str, str] = {}
        with CuratorClient(live_server.url) as client:
            while len(delivered) < len(ids):  # long polls: the dead trainer's groups come back after expiry
                batch = client.lease("survivor", max_groups=10, wait_seconds=30)
                assert batch is not None
                delivered |= {gid: batch["batch_id"] for gid in group_ids(batch)}
                client.ack(batch["batch_id"])
            assert client.get_batch(held["batch_id"])["status"] == "expired"
    finally:
        if proc.poll() is None:
            proc.kill()
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, expires_at, ended_at FROM leases")).all()
        consumed = conn.execute(text("SELECT count(*) FROM groups WHERE status = 'consumed'")).scalar_one()
    engine.dispose()
    leases = {r.id: r for r in rows}
    dead = leases[held["batch_id"]]
    assert consumed == 4 and dead.ended_at > dead.expires_at  # reaped only after its deadline
    for gid in held["groups"]:  # re-leased only after it: a new lease's deadline is 300 s after its creation
        assert (leases[delivered[gid]].expires_at - dead.expires_at).total_seconds() > 300


def test_racing_retries_of_one_request_get_one_batch(live_server):
    engine = create_engine(live_server.db_url)
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        seed_ready(http, engine, 20, prefix="race")

    def lease(_: int) -> dict:
        with CuratorClient(live_server.url) as client:
            return client.lease("t0", max_groups=3, request_id="the-same-request")  # type: ignore[return-value]

    with ThreadPoolExecutor(8) as pool:
        batches = list(pool.map(lease, range(8)))
    assert len({b["batch_id"] for b in batches}) == 1
    assert len({tuple(group_ids(b)) for b in batches}) == 1
    assert sum(not b["stats"]["replayed"] for b in batches) == 1
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM leases")).scalar_one() == 1
        assert conn.execute(text("SELECT count(*) FROM groups WHERE status = 'leased'")).scalar_one() == 3
    engine.dispose()
