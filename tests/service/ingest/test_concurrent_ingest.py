"""16 threads posting the same group id concurrently over real HTTP store exactly one group."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from sqlalchemy import create_engine, text

from tests.helpers import make_group


def test_sixteen_threads_same_id_store_one_group(live_server):
    group = make_group("race-1", n=8)

    def post(_: int) -> int:
        with httpx.Client(base_url=live_server.url, timeout=30) as http:
            return http.post("/v1/groups", json=group).status_code

    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(post, range(16)))
    assert sorted(codes) == [200] * 15 + [201]
    engine = create_engine(live_server.db_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM groups")).scalar_one() == 1
        assert conn.execute(text("SELECT count(*) FROM trajectories")).scalar_one() == 8
    engine.dispose()


def test_concurrent_conflicting_bodies_one_wins_rest_409(live_server):
    def post(i: int) -> int:
        with httpx.Client(base_url=live_server.url, timeout=30) as http:
            return http.post("/v1/groups", json=make_group("race-2", policy_version=i)).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(post, range(8)))
    assert sorted(codes) == [201] + [409] * 7


def test_acknowledged_means_committed(live_server):
    """The transaction commits before the answer is sent: a 201 is visible to any other reader at once."""
    engine = create_engine(live_server.db_url)
    with httpx.Client(base_url=live_server.url, timeout=30) as http, engine.connect() as conn:
        for i in range(30):
            assert http.post("/v1/groups", json=make_group(f"dur-{i}", prompt_id=f"dp-{i}")).status_code == 201
            seen = conn.execute(text("SELECT count(*) FROM groups WHERE id = :id"), {"id": f"dur-{i}"}).scalar_one()
            conn.rollback()
            assert seen == 1
    engine.dispose()


def test_batches_sharing_ids_in_opposite_orders_never_deadlock(live_server):
    """[a, b] and [b, a] posted together: each group row goes in by id, so the two wait in one direction. In
    request order each held one id while waiting for the other's (40P01, a 500: helper-35 F2). Made
    deterministic by two open transactions holding a and b: the batches queue behind them, a is let go, and
    only when both batches wait again is b let go."""
    from sqlalchemy.orm import Session

    from service.ingest import service as ingest
    from service.ingest.schemas import GroupIn

    engine = create_engine(live_server.db_url)
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        assert http.post("/v1/groups", json=make_group("seed", prompt_id="pd")).status_code == 201
    bodies = {gid: make_group(gid, prompt_id="pd", inline_prompt=False) for gid in ("a", "b")}

    def hold(gid: str) -> tuple[Session, int]:
        s = Session(engine)
        ingest.ingest_groups(s, [GroupIn.model_validate(bodies[gid])], max_group_size=64,
                             max_sequence_tokens=4096, batched=False)
        return s, s.execute(text("SELECT pg_backend_pid()")).scalar_one()

    def waiting(conn, blocker: int | None = None) -> int:
        sql = "SELECT count(*) FROM pg_stat_activity WHERE cardinality(pg_blocking_pids(pid)) > 0"
        if blocker is not None:
            sql += f" AND {blocker} = ANY(pg_blocking_pids(pid))"
        n = conn.execute(text(sql)).scalar_one()
        conn.rollback()
        return n

    def until(check) -> None:
        deadline = time.monotonic() + 30
        while not check():
            assert time.monotonic() < deadline, "the batches never reached the expected waits"
            time.sleep(0.01)

    def post(order: tuple[str, str]) -> int:
        with httpx.Client(base_url=live_server.url, timeout=60) as http:
            return http.post("/v1/groups", json={"groups": [bodies[g] for g in order]}).status_code

    (hold_b, _), (hold_a, a_pid) = hold("b"), hold("a")
    with engine.connect() as monitor, ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(post, ("a", "b")), pool.submit(post, ("b", "a"))]
        until(lambda: waiting(monitor) == 2)
        hold_a.rollback()  # a is free: whoever takes it goes on to b (held), the other waits where it is
        until(lambda: waiting(monitor) == 2 and waiting(monitor, a_pid) == 0)
        hold_b.rollback()
        codes = sorted(f.result() for f in futures)
    hold_a.close()
    hold_b.close()
    assert codes in ([200, 201], [201, 201]), codes
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM groups WHERE id IN ('a', 'b')")).scalar_one() == 2
        assert conn.execute(text("SELECT count(*) FROM trajectories t JOIN groups g ON g.pk = t.group_pk"
                                 " WHERE g.id IN ('a', 'b')")).scalar_one() == 8
    engine.dispose()
