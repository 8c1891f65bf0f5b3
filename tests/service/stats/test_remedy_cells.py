"""The remedy log in the stats rollup (migration 0017): ``GET /v1/stats``' ``remedies`` is read from cells, not
by counting the decision log on every request (a scan of every decision row: ~110 ms a request at 1 M rows),
and the counts stay when their groups go to the archive; a rebuild and the migration give the cells the
steps added as they were logged."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, text

from service.archive import service as archive
from service.store.db import get_engine
from service.store.migrate import downgrade, upgrade
from service.worker.pipeline import drain
from tests.helpers import make_group, make_trajectory, register_spec

SPEC = {"name": "math", "components": [{"name": "correct", "kind": "verifier.math", "outcome": True}]}


def _remedy_cells(engine: Engine) -> dict[tuple[str, str, str], dict[str, float]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT key, dataset, bucket, counters FROM stats_cells WHERE dim = 'remedy'"))
        return {(k, ds, str(b)): c for k, ds, b, c in rows}


def _remedies(api, **params: Any) -> dict[str, dict[str, int]]:
    r = api.get("/v1/stats", params={"by": "dataset", **params})
    assert r.status_code == 200, r.text
    return r.json()["remedies"]


def _statements_of(api, path: str, **params: Any) -> list[str]:
    seen: list[str] = []
    listener = lambda *args: seen.append(args[2])  # noqa: E731 -- (conn, cursor, statement, ...)
    event.listen(Engine, "before_cursor_execute", listener)
    try:
        assert api.get(path, params=params).status_code == 200
    finally:
        event.remove(Engine, "before_cursor_execute", listener)
    return seen


def test_remedies_come_from_cells_and_survive_archive_rebuild_and_migration(fresh_api, fresh_db: str, scorer,
                                                                           tmp_path: Path) -> None:
    api, engine = fresh_api, get_engine(fresh_db)
    register_spec(api, SPEC)
    policy = {"name": "rs", "finish_reason_actions": {"length": "resample"}, "resample_wait_seconds": 3600}
    assert api.post("/v1/curation-policies", json=policy).status_code == 201
    for ds in ("one", "two"):
        assert api.put(f"/v1/datasets/{ds}", json={"reward_spec": "math", "curation_policy": "rs"}).status_code == 200
    groups = []
    for gid, ds in (("g1", "one"), ("g2", "one"), ("g3", "two")):
        g = make_group(gid, prompt_id=f"p-{gid}", dataset=ds, answers=["42", "41", "42", "7"])
        g["trajectories"][3]["finish_reason"] = "length"  # cut: its slot is resampled
        groups.append(g)
    assert api.post("/v1/groups", json={"groups": groups}).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    for gid in ("g1", "g3"):  # g2's slot stays open
        fill = {"policy_version": 1, "trajectory": make_trajectory(answer="42", seed=9)}
        assert api.post(f"/v1/groups/{gid}/trajectories/3", json=fill).status_code == 201
    drain(api.factory, scorer, timeout_s=60)

    want_all = {"resample": {"filled": 2, "requested": 3}}
    assert _remedies(api) == want_all
    assert _remedies(api, dataset="one") == {"resample": {"filled": 1, "requested": 2}}
    assert _remedies(api, dataset="two", since="2000-01-01T00:00:00Z") == {"resample": {"filled": 1, "requested": 1}}
    assert _remedies(api, since="2999-01-01T00:00:00Z") == {}
    # a query reads cells whatever the size of the decision log
    for params in ({}, {"dataset": "one"}, {"since": "2000-01-01T00:00:00Z"}):
        assert not [s for s in _statements_of(api, "/v1/stats", **params) if "decisions" in s], params
    incremental = _remedy_cells(engine)

    assert api.post("/v1/stats/rebuild").status_code == 200  # a rebuild gives the cells the steps added
    assert _remedy_cells(engine) == incremental
    downgrade(fresh_db, "0016_prompt_prefixes")  # the older code counts decision rows: no remedy cells
    assert _remedy_cells(engine) == {}
    upgrade(fresh_db)  # 0017 counts the stored steps
    assert _remedy_cells(engine) == incremental and _remedies(api) == want_all

    # g1 and g3 are trained (leased and acknowledged), then archived: their steps stay counted
    r = api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 2})
    assert r.status_code == 200, r.text
    assert sorted(g["id"] for g in r.json()["groups"]) == ["g1", "g3"]
    assert api.post(f"/v1/batches/{r.json()['batch_id']}/ack").status_code == 200
    assert api.post("/v1/policy", json={"version": 1000, "metrics": {}}).status_code == 201  # out of the monitors' window
    assert archive.archive(engine, str(tmp_path), timedelta(0)).groups == 2
    assert api.get("/v1/groups/g1").json()["status"] == "archived"
    assert _remedies(api) == want_all and _remedies(api, dataset="two") == {"resample": {"filled": 1, "requested": 1}}
    assert api.post("/v1/stats/rebuild").status_code == 200  # the archived groups' steps come from their cells
    assert _remedy_cells(engine) == incremental and _remedies(api) == want_all
