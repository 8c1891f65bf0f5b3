"""The short crash suite (bench/chaos.py): real API, worker, producer and consumer processes on a private
PostgreSQL, SIGKILLed and restarted (PostgreSQL included); nothing acknowledged is lost or doubled."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from bench import chaos
from reward_models.scoring import Scorer
from service.worker.pipeline import drain


@pytest.mark.skipif(shutil.which("initdb") is None or shutil.which("pg_ctl") is None,
                    reason="needs PostgreSQL's initdb / pg_ctl for a private cluster")
def test_short_kill_suite_loses_nothing():
    r = chaos.run(cycles=5, interval=0.8, pg_every=2, drain_s=40, seed=1, keep=False)
    assert r["killed"].get("postgres") == 2
    assert r["killed"].get("api", 0) >= 1 and r["killed"].get("worker", 0) >= 1  # the last kill: both at once
    # issue 26: with the default 30 s claims, everything acknowledged is scored and curated (ready,
    # leased or final) within 120 s after the last kill -9 of an API process and a score worker
    assert not r["unsettled"], (f"{len(r['unsettled'])} acknowledged groups not final {chaos.SETTLE_S:g} s"
                                f" after the last kill (id: status): {r['unsettled'][:20]}")
    assert r["settle_s"] is not None and r["settle_s"] <= chaos.SETTLE_S
    assert r["acknowledged"] > 0 and r["consumed"] > 0
    assert (r["lost"], r["duplicated"], r["stuck"], r["consumed_twice"]) == (0, 0, 0, 0), r
    assert r["poison_batches_reaching_consumers"] == 0
    assert all(not k.endswith("(None)") for k in r["poison"]), r["poison"]  # every poison group ended


# -- 5. the chaos checker cannot see a good group that never reached a trainer ---------------------------
def _good_ids(n: int) -> list[str]:
    from bench.chaos import group_body

    out, i = [], 0
    while len(out) < n:
        if group_body(f"p0-{i}")[1] == "good":
            out.append(f"p0-{i}")
        i += 1
    return out


# Attack: the chaos checker could not see a good group that worker crashes dropped before any trainer saw it.
def test_chaos_checker_counts_a_good_group_killed_off_by_worker_crashes(api, fresh_db, tmp_path):
    """``check`` calls a group lost only when it is absent or has other trajectory / token counts. A good
    group the API acknowledged that ends 'reward_error' because score workers were SIGKILLed while
    scoring it (every attempt used up; 'did not finish') never reaches a trainer, yet the report says
    lost 0, stuck 0 and the run passes. ('duplicated' cannot be non-zero either: groups.id is UNIQUE.)"""
    from types import SimpleNamespace

    from bench.chaos import check, group_body
    from service.worker import repository as repo

    ids = _good_ids(2)
    log = []
    for gid in reversed(ids):  # the victim first: the lowest pk, the one a claim takes
        body, kind = group_body(gid)
        r = api.post("/v1/groups", json=body)
        assert r.status_code in (200, 201), r.text
        log.append({"id": gid, "status": r.status_code, "kind": kind,
                    "n_tokens": sum(len(t.get("token_ids", [])) for t in body["trajectories"]),
                    "n_trajectories": len(body["trajectories"])})
    (tmp_path / "p0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in log))
    # the second group: every scoring attempt claimed by a worker that was killed before writing back
    victim = ids[1]
    for _ in range(4):
        with api.factory.begin() as s:
            pks = repo.claim_received(s, "killed-worker", 1, 0.05, 4)
        time.sleep(0.1)
    # the first group goes the normal way: scored, curated, leased, acked
    with Scorer(processes=1, timeout_s=20) as scorer:
        drain(api.factory, scorer, max_attempts=4)
    assert api.get(f"/v1/groups/{victim}").json()["status"] == "reward_error"
    while (r := api.post("/v1/batches/lease", json={"trainer_id": "c0", "max_groups": 4})).status_code == 200:
        assert api.post(f"/v1/batches/{r.json()['batch_id']}/ack").status_code == 200
    assert api.get(f"/v1/groups/{ids[0]}").json()["status"] == "consumed"
    assert pks  # the claims really happened

    report = check(SimpleNamespace(root=tmp_path, pg=SimpleNamespace(url=fresh_db.replace("+psycopg", ""))))
    assert report["acknowledged"] == 2
    flagged = sum(report.get(k) or 0 for k in ("lost", "stuck", "good_not_consumed", "good_dropped"))
    assert flagged >= 1, f"a good acknowledged group that never trained passes the checker: {report}"
