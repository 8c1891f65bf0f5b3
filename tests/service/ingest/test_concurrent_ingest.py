"""16 threads posting the same group id concurrently over real HTTP store exactly one group."""

from __future__ import annotations

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
