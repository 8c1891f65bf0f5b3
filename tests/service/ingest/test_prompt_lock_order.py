"""One lock order for prompt rows. Curation's outcome update locks prompts FOR UPDATE in id order; an
ingest of groups takes KEY SHARE locks on their prompts (the foreign-key checks). Before, the ingest took
them in request order: holding prompt B while waiting for A, which the worker held while it waited for B
-> DeadlockDetected "while locking tuple ... in relation prompts" (seen in the demo's log). The colliding
paths run concurrently here, in the interleaving that deadlocked."""

from __future__ import annotations

import threading
import time

from sqlalchemy import text

from service.curation import repository as curate_repo
from tests.helpers import make_group


def _wait_until_blocked(api, what: str, timeout_s: float = 30) -> None:
    """Until some backend waits on a lock (the ingest request queued behind the worker's row lock)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with api.factory() as s:
            if s.scalar(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                             " AND datname = current_database()")):
                return
        time.sleep(0.05)
    raise AssertionError(f"{what} never waited on a lock")


def _post_prompts(api, ids: list[str]) -> None:
    prompts = [{"id": pid, "dataset": "toy", "messages": [{"role": "user", "content": f"q {pid}"}],
                "reference": {"answer": "42"}} for pid in ids]
    assert api.post("/v1/prompts", json={"prompts": prompts}).status_code == 200


def test_ingest_and_outcome_update_lock_prompts_in_one_order(api):
    _post_prompts(api, ["lock-a", "lock-b"])
    # the batch names prompt b before a: in request order its FK checks would hold b while waiting for a
    body = {"groups": [make_group("g-b", prompt_id="lock-b", inline_prompt=False),
                       make_group("g-a", prompt_id="lock-a", inline_prompt=False)]}
    answer: dict = {}
    with api.factory() as worker:
        worker.begin()
        curate_repo.record_outcomes(worker, [("lock-a", 0.5)])  # the worker holds prompt a ...
        ingest = threading.Thread(target=lambda: answer.update(r=api.post("/v1/groups", json=body)))
        ingest.start()
        _wait_until_blocked(api, "the ingest")
        curate_repo.record_outcomes(worker, [("lock-b", 0.25)])  # ... and now wants b
        worker.commit()
    ingest.join(timeout=60)
    assert answer["r"].status_code in (200, 201), answer["r"].text
    assert [g["status"] for g in answer["r"].json()["groups"]] == ["received", "received"]
    with api.factory() as s:
        assert dict(s.execute(text("SELECT id, n_groups FROM prompts ORDER BY id")).all()) == {"lock-a": 1, "lock-b": 1}


def test_prompt_upserts_in_opposite_orders_never_deadlock(api):
    """Two admins' POST /v1/prompts with the same prompts in opposite orders, many times at once."""
    ids = [f"up-{i:02d}" for i in range(20)]
    _post_prompts(api, ids)
    failures: list[str] = []

    def upsert(order: list[str], n: int) -> None:
        for k in range(n):
            prompts = [{"id": pid, "dataset": "toy", "messages": [{"role": "user", "content": f"q {pid} {k}"}],
                        "reference": {"answer": str(k)}} for pid in order]
            r = api.post("/v1/prompts", json={"prompts": prompts})
            if r.status_code != 200:
                failures.append(r.text)

    threads = [threading.Thread(target=upsert, args=(order, 15)) for order in (ids, ids[::-1], ids, ids[::-1])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert failures == []
