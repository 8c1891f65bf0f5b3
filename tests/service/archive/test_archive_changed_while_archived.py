"""A group that changes between the archiver's read and its transaction (a rescore or recurate taking a
dropped group back through the pipeline to 'dropped' again: same status, other scores) stays hot with its new
content, nothing stale is recorded or left on disk, and the next run archives the new content. The same after
a kill -9 between writing the files and recording them. The change is made for real (the API, then the worker)
from other connections, at the point the archiver's ``before_record`` hook marks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.archive import service as archive
from service.store.db import get_engine
from service.store.models import ArchiveFile, Group, GroupTombstone
from service.worker.pipeline import drain
from tests.conftest import ROOT
from tests.helpers import make_group

SPEC = {"name": "arc", "components": [{"name": "correct", "kind": "verifier.math", "outcome": True}]}
SPEC_V2 = {"name": "arc", "components": [{"name": "exact", "kind": "verifier.exact_match", "outcome": True}]}


def _seed(api, scorer) -> None:
    """'zero' (both answers right: zero variance, dropped) and 'mate' (consumed), outside the monitors' window."""
    assert api.post("/v1/reward-specs", json=SPEC).status_code == 201
    assert api.put("/v1/datasets/toy", json={"reward_spec": "arc"}).status_code == 200
    groups = [make_group("mate", answers=["42", "0"]), make_group("zero", answers=["42", "42"])]
    assert api.post("/v1/groups", json={"groups": groups}).status_code == 201
    drain(api.factory, scorer)
    r = api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 1})
    assert r.status_code == 200 and api.post(f"/v1/batches/{r.json()['batch_id']}/ack").status_code == 200
    assert api.post("/v1/policy", json={"version": 1000, "metrics": {}}).status_code == 201
    assert _hot(api) == {"mate": ("consumed", "arc@1", "default@1"), "zero": ("dropped", "arc@1", "default@1")}


def _hot(api) -> dict[str, tuple[str, str, str]]:
    with api.factory() as s:
        rows = s.execute(select(Group.id, Group.status, Group.reward_spec_name, Group.reward_spec_version,
                                Group.curation_policy_name, Group.curation_policy_version))
        return {gid: (st, f"{rs}@{rv}", f"{cp}@{cv}") for gid, st, rs, rv, cp, cv in rows}


def _send_back(api, scorer, how: str) -> None:
    """What an operator and the worker do: rescore (or recurate) the dropped group under a new version; the
    worker takes it through scoring and curation to 'dropped' again."""
    if how == "rescore":
        assert api.post("/v1/reward-specs", json=SPEC_V2).status_code == 201
        r = api.post("/v1/rescore", json={"reward_spec": "arc@2", "group_ids": ["zero"]})
    else:
        assert api.post("/v1/curation-policies", json={"name": "strict"}).status_code == 201
        r = api.post("/v1/recurate", json={"curation_policy": "strict", "group_ids": ["zero"]})
    assert r.status_code == 200 and r.json()["groups"] == 1, r.text
    assert _hot(api)["zero"][0] != "dropped"
    drain(api.factory, scorer)
    assert _hot(api)["zero"][0] == "dropped"  # A -> B -> A: only the content tells


NEW = {"rescore": ("dropped", "arc@2", "default@1"), "recurate": ("dropped", "arc@1", "strict@1")}


def _nothing_archived(engine, to: Path) -> None:
    with Session(engine) as s:
        assert s.execute(select(ArchiveFile.location)).scalars().all() == []
        assert s.execute(select(GroupTombstone.id)).scalars().all() == []
    assert list(to.rglob("*.parquet")) == []  # the stale copy is gone, not merely unrecorded


def _archived_once(api, engine, to: Path, how: str) -> None:
    """Each group in exactly one file on disk, every file recorded, 'zero' as last scored and curated."""
    with Session(engine) as s:
        recorded = set(s.execute(select(ArchiveFile.location).where(ArchiveFile.kind == "all")).scalars())
    on_disk = pl.read_parquet(to / "all", hive_partitioning=True)
    assert {str(p) for p in (to / "all").rglob("*.parquet")} == recorded
    assert sorted(on_disk.group_by("group_id").len().rows()) == [("mate", 2), ("zero", 2)]
    zero = on_disk.filter(pl.col("group_id") == "zero").to_dicts()
    spec, policy = NEW[how][1:]
    for row in zero:
        assert row["status"] == "dropped"
        assert f"{row['reward_spec_name']}@{row['reward_spec_version']}" == spec
        assert f"{row['curation_policy_name']}@{row['curation_policy_version']}" == policy
        components = [c["component"] for c in json.loads(row["rewards"])]
        assert components == (["exact"] if how == "rescore" else ["correct"])
    assert api.get("/v1/groups/zero").json()["status"] == "archived"
    assert _hot(api) == {}


@pytest.mark.parametrize("how", ["rescore", "recurate"])
def test_a_group_sent_back_while_archived_stays_hot_then_archives_new(fresh_api, fresh_db: str, scorer,
                                                                       tmp_path: Path, how: str) -> None:
    api, engine = fresh_api, get_engine(fresh_db)
    _seed(api, scorer)
    batches: list[list[int]] = []

    def change_it(pks: list[int]) -> None:  # the batch's rows are read and its files written, not recorded
        batches.append(pks)
        assert sorted(p.name for p in (tmp_path / "all").rglob("*.parquet"))  # the copy that goes stale
        _send_back(api, scorer, how)

    result = archive.archive(engine, str(tmp_path), timedelta(0), before_record=change_it)
    assert len(batches) == 1 and len(batches[0]) == 2  # mate and zero, one batch
    assert (result.groups, result.files, result.locations, result.skipped) == (0, 0, [], 2)
    assert _hot(api) == {"mate": ("consumed", "arc@1", "default@1"), "zero": NEW[how]}  # kept, new content
    _nothing_archived(engine, tmp_path)

    later = archive.archive(engine, str(tmp_path), timedelta(0))
    assert (later.groups, later.skipped, later.orphans_removed) == (2, 0, 0)
    _archived_once(api, engine, tmp_path, how)


_KILLED_RUN = """
import os, signal, sys
from datetime import timedelta
from service.archive import service as archive
from service.store.db import get_engine
archive.archive(get_engine(sys.argv[1]), sys.argv[2], timedelta(0),
                before_record=lambda pks: os.kill(os.getpid(), signal.SIGKILL))
"""


def test_kill_9_between_write_and_record_then_a_rescore_loses_and_doubles_nothing(fresh_api, fresh_db: str,
                                                                                  scorer, tmp_path: Path) -> None:
    """A real archiver process SIGKILLed after writing its files, before recording them; the group is rescored
    while it is down; the next run deletes the unrecorded (now stale) files and archives the new content once."""
    api, engine = fresh_api, get_engine(fresh_db)
    _seed(api, scorer)
    p = subprocess.run([sys.executable, "-c", _KILLED_RUN, fresh_db, str(tmp_path)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, env={**os.environ, "DATABASE_URL": fresh_db})
    assert p.returncode == -9, p.stderr
    stale = sorted(tmp_path.rglob("*.parquet"))
    assert stale and set(_hot(api)) == {"mate", "zero"}  # written, not recorded: both groups still hot
    with Session(engine) as s:
        assert s.execute(select(ArchiveFile.location)).scalars().all() == []

    _send_back(api, scorer, "rescore")
    result = archive.archive(engine, str(tmp_path), timedelta(0))
    assert (result.groups, result.skipped, result.orphans_removed) == (2, 0, len(stale))
    _archived_once(api, engine, tmp_path, "rescore")
