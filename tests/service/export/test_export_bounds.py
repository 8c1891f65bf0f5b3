"""Exports are bounded in memory: a page by bytes as well as rows, and a process streams a capped number.

Attack (round 2, /tmp/attack-svc/e_stuck.py): 40 viewer exports whose clients stopped reading pushed the
server's RSS to 2 GB: each held a page of 1000 rows whatever their size, and nothing capped how many exports
streamed at once. Now a page also stops at ``export_batch_bytes`` of trajectory JSON (whole groups, at
least one), and beyond ``export_max_concurrent`` streaming exports a new one is a 429 with Retry-After.
"""

from __future__ import annotations

import httpx

from service.export import repository as repo
from service.export import service as export
from service.export.schemas import ExportQuery
from service.store.db import get_engine, make_sessionmaker
from tests.conftest import start_server, stop_server
from tests.service.api.test_slow_clients_and_scores import eventually, fill, stuck_export

FILTERS = {"dataset": "big", "min_policy_version": None, "max_policy_version": None,
           "statuses": list(export.SCORED_STATUSES)}


def test_a_page_stops_at_its_byte_budget_and_the_export_still_reads_every_row(fresh_db: str) -> None:
    fill(fresh_db)  # 3000 groups of 4 trajectories, each about 2 KB of message JSON
    factory = make_sessionmaker(get_engine(fresh_db))
    with factory() as session:
        by_rows = repo.group_page(session, after_pk=0, max_rows=1000, **FILTERS)
        by_bytes = repo.group_page(session, after_pk=0, max_rows=1000, max_bytes=64 * 1024, **FILTERS)
        one = repo.group_page(session, after_pk=0, max_rows=1000, max_bytes=1, **FILTERS)
    assert len(by_rows) == 250  # 1000 rows of whole groups
    assert 0 < len(by_bytes) < 10 and by_bytes == by_rows[:len(by_bytes)]  # 64 KB: a few groups of ~8 KB
    assert len(one) == 1  # always at least one group
    q = ExportQuery(format="rollouts", dataset="big")
    rows = list(export.rows(factory, q, batch_rows=1000, batch_bytes=64 * 1024))
    assert len(rows) == 12_000 and len({(r["group_pk"], r["idx"]) for r in rows}) == 12_000


def test_exports_beyond_the_concurrent_cap_get_429_and_a_slot_comes_back(fresh_db: str) -> None:
    fill(fresh_db)
    server = start_server(fresh_db, env={"GRPO_CURATOR_EXPORT_MAX_CONCURRENT": "2"})
    socks = []
    try:
        socks = [stuck_export(server.url) for _ in range(2)]  # two clients that stopped reading
        params = {"format": "rollouts", "dataset": "big"}
        r = httpx.get(f"{server.url}/v1/export", params=params, timeout=30)
        assert r.status_code == 429, r.text[:200]
        assert "export_max_concurrent=2" in r.json()["error"] and int(r.headers["Retry-After"]) >= 1
        assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
        for s in socks:
            s.close()
        # the slots come back when the responses end (not when a garbage collection finds them)
        one = {**params, "limit": "1"}
        assert eventually(lambda: httpx.get(f"{server.url}/v1/export", params=one, timeout=30).status_code == 200,
                          timeout_s=20)
        with httpx.stream("GET", f"{server.url}/v1/export", params=params, timeout=60) as resp:
            assert resp.status_code == 200 and sum(1 for _ in resp.iter_lines()) == 12_000
    finally:
        for s in socks:
            s.close()
        stop_server(server)


def test_an_export_dropped_before_its_first_byte_gives_its_slot_back() -> None:
    slots = export.ExportSlots(limit=1)
    guarded = slots.guard(iter([b"x"]))
    assert slots.streaming == 1
    del guarded  # never iterated (the client left before the response started)
    assert slots.streaming == 0
    assert list(slots.guard(iter([b"a", b"b"]))) == [b"a", b"b"] and slots.streaming == 0


