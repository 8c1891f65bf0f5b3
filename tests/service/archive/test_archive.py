"""Archive: hot groups -> Parquet (a directory, and S3 through a fake) -> read back bit for bit with polars;
archived ids stay idempotent (same body 200, another 409); GET says where the group went; the stats rollup
keeps archived groups (through a rebuild too); the export reads them back; only final, old groups go."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import numpy as np
import polars as pl
import pytest
from pyarrow import fs as pafs
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from reward_models.scoring import Scorer
from service.archive import service as archive
from service.store.db import get_engine
from service.store.models import ArchiveFile, Group, GroupTombstone, Trajectory
from service.worker.pipeline import drain
from tests.conftest import free_port
from tests.helpers import make_group

SPEC = {"name": "arc", "components": [{"name": "correct", "kind": "verifier.math", "outcome": True}]}


def _groups() -> list[dict]:
    cut = make_group("a-1", prompt_id="p-1", answers=["42", "41", "42", "7"], policy_version=1)
    cut["trajectories"][3]["finish_reason"] = "length"  # masked (the default): never delivered, never trained
    return [
        cut,
        make_group("a-2", prompt_id="p-1", answers=["42", "0"], policy_version=2),
        make_group("a-3", prompt_id="p-2", answers=["1", "42", "42"], dataset="other/ds", policy_version=2),
        make_group("a-zero", prompt_id="p-1", answers=["42", "42"], policy_version=3),  # zero variance: dropped
        make_group("a-hot", prompt_id="p-1", answers=["42", "5"], policy_version=3),  # stays ready
    ]


def _seed(api) -> None:
    assert api.post("/v1/reward-specs", json=SPEC).status_code == 201
    for ds in ("toy", "other/ds"):
        assert api.put(f"/v1/datasets/{ds.replace('/', '%2F')}", json={"reward_spec": "arc"}).status_code == 200
    r = api.post("/v1/groups", json={"groups": _groups()})
    assert r.status_code == 201, r.text
    with Scorer(processes=1, timeout_s=20) as scorer:
        drain(api.factory, scorer, timeout_s=120)
    r = api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 3})
    assert r.status_code == 200, r.text
    assert api.post(f"/v1/batches/{r.json()['batch_id']}/ack").status_code == 200
    leave_the_window(api)


def leave_the_window(api, version: int = 1000) -> None:
    """Publish a policy version far past the groups' (1-3): the monitors' window (the last
    alert_window_versions versions, which the archiver keeps hot) no longer holds them."""
    assert api.post("/v1/policy", json={"version": version, "metrics": {}}).status_code == 201


def _hot(engine, ids: list[str]) -> dict[tuple[str, int], tuple[bytes, bytes, bytes]]:
    with Session(engine) as s:
        rows = s.execute(select(Group.id, Trajectory.idx, Trajectory.token_ids, Trajectory.logprobs, Trajectory.loss_mask)
                         .join(Trajectory, Trajectory.group_pk == Group.pk).where(Group.id.in_(ids)))
        return {(gid, idx): (bytes(tok), bytes(lp), bytes(lm)) for gid, idx, tok, lp, lm in rows}


def _statuses(engine) -> dict[str, str]:
    with Session(engine) as s:
        return dict(s.execute(select(Group.id, Group.status)).all())


def _check_read_back(df: pl.DataFrame, before: dict) -> None:
    got = {}
    for r in df.iter_rows(named=True):
        got[(r["group_id"], r["index"])] = (
            np.asarray(r["token_ids"], dtype="<i4").tobytes(), np.asarray(r["logprobs"], dtype="<f4").tobytes(),
            np.asarray(r["loss_mask"], dtype="u1").tobytes())
    assert got == before  # token ids, log-probs and loss masks: the stored bytes exactly


@pytest.fixture
def seeded(fresh_api):
    _seed(fresh_api)
    return fresh_api


def _final_ids(engine) -> list[str]:
    return sorted(i for i, s in _statuses(engine).items() if s in archive.FINAL_STATUSES)


def test_round_trip_local_dir(seeded, fresh_db: str, tmp_path: Path) -> None:
    api, engine = seeded, get_engine(fresh_db)
    final = _final_ids(engine)
    assert "a-zero" in final and "a-hot" not in final and len(final) >= 3
    before = _hot(engine, final)
    stats_before = api.get("/v1/stats", params={"by": "policy_version"}).json()
    assert stats_before["rows"], stats_before

    assert archive.archive(engine, str(tmp_path), timedelta(days=1)).groups == 0  # too young: nothing moves
    result = archive.archive(engine, str(tmp_path), timedelta(0), batch_groups=2)
    assert result.groups == len(final) and result.trajectories == len(before)
    assert set(_statuses(engine)) == {"a-hot"}  # only the group that is not final stays hot

    df = pl.read_parquet(tmp_path / "all", hive_partitioning=True)
    _check_read_back(df, before)
    for column in ("group_id", "prompt_id", "dataset", "policy_version", "index", "status", "token_ids", "loss_mask",
                   "logprobs", "advantage", "total_reward", "finish_reason", "messages"):
        assert column in df.columns
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == ["dataset=other%2Fds", "dataset=toy"]
    assert all(p.name.startswith("date=") for p in (tmp_path / "all" / "dataset=toy").iterdir())
    eff = pl.read_parquet(tmp_path / "effective", hive_partitioning=True)
    # effective/: what a trainer trained on -- a lease delivers keep and penalize members only (attack: the
    # masked cut member of a consumed group was there too)
    assert set(eff["status"]) == {"consumed"} and set(eff["action"]) <= {"keep", "penalize"}
    assert "a-zero" not in set(eff["group_id"])
    assert ("a-1", 3) in set(zip(df["group_id"], df["index"], strict=True))
    assert sorted(eff.filter(pl.col("group_id") == "a-1")["index"]) == [0, 1, 2]

    # GET: archived, and where to
    r = api.get("/v1/groups/a-1")
    assert r.status_code == 200 and r.json()["status"] == "archived"
    loc = r.json()["archive"]["location"]
    assert loc.startswith(str(tmp_path / "all" / "dataset=toy")) and Path(loc).exists()
    assert r.json()["archive"]["final_status"] == "consumed"
    assert api.get("/v1/groups/nope").status_code == 404

    # re-posting an archived id: same body 200, another body 409, nothing stored hot either way
    body = next(g for g in _groups() if g["id"] == "a-1")
    r = api.post("/v1/groups", json=body)
    assert r.status_code == 200 and r.json()["status"] == "archived" and r.json()["created"] is False
    changed = {**body, "policy_version": 9}
    r = api.post("/v1/groups", json=changed)
    assert r.status_code == 409 and "archived" in r.json()["error"]
    r = api.post("/v1/groups", json={"groups": [body, make_group("a-new", prompt_id="p-1", answers=["1", "2"])]})
    assert r.status_code == 201 and [g["status"] for g in r.json()["groups"]] == ["archived", "received"]
    assert "a-1" not in _statuses(engine)

    # stats keep the archived groups, through a rebuild of the rollup too
    assert api.get("/v1/stats", params={"by": "policy_version"}).json() == stats_before
    assert api.post("/v1/stats/rebuild").status_code == 200
    assert api.get("/v1/stats", params={"by": "policy_version"}).json() == stats_before

    # the export reads archived rows back (rollouts, token arrays included)
    r = api.get("/v1/export", params={"format": "rollouts", "include_archived": "true", "status": list(
        archive.FINAL_STATUSES)})
    assert r.status_code == 200, r.text
    rows = [__import__("json").loads(line) for line in r.text.splitlines()]
    assert {(x["group_id"], x["index"]) for x in rows} == set(before)
    for x in rows:
        assert np.asarray(x["token_ids"], dtype="<i4").tobytes() == before[(x["group_id"], x["index"])][0]
    r = api.get("/v1/export", params={"format": "verl", "include_archived": "true"})
    assert r.status_code == 422 and "include_archived" in r.json()["error"]

    # a second run finds nothing new and leaves the files as they are
    files = sorted(p for p in tmp_path.rglob("*.parquet"))
    again = archive.archive(engine, str(tmp_path), timedelta(0))
    assert again.groups == 0 and again.orphans_removed == 0 and sorted(tmp_path.rglob("*.parquet")) == files


def _owner(engine) -> str:
    from service.archive import repository as repo

    with Session(engine) as s, s.begin():
        return repo.identity(s)


def test_unrecorded_file_is_removed_and_rewritten(seeded, fresh_db: str, tmp_path: Path) -> None:
    """A file written by a run of this database that died before recording it: the next run deletes it and
    writes its own. Files another database wrote (another id, or a name from before ids) stay."""
    engine = get_engine(fresh_db)
    owner = _owner(engine)
    part = tmp_path / "all" / "dataset=toy" / "date=2026-01-01"
    part.mkdir(parents=True)
    stray = part / f"part-{owner}-0000000000000000001-0000000000000000002.parquet"
    foreign = [part / "part-0123456789abcdef-0000000000000000001-0000000000000000002.parquet",
               part / "part-0000000000000000001-0000000000000000002.parquet"]
    for p in (stray, *foreign):
        p.write_bytes(b"half a file")
    result = archive.archive(engine, str(tmp_path), timedelta(0))
    assert result.orphans_removed == 1 and not stray.exists() and all(p.exists() for p in foreign)
    with Session(engine) as s:
        recorded = set(s.execute(select(ArchiveFile.location)).scalars())
    assert {str(p) for p in tmp_path.rglob("*.parquet")} == recorded | {str(p) for p in foreign}
    assert all(f"part-{owner}-" in loc for loc in recorded)


def test_a_target_reached_through_a_symlink_keeps_its_files(seeded, fresh_db: str, tmp_path: Path) -> None:
    """The same directory as --to through a symlink, then through its real path (a worker's mount and the
    CLI's, say): the second run removes nothing, every recorded file stays readable."""
    api, engine = seeded, get_engine(fresh_db)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    first = archive.archive(engine, str(tmp_path / "link"), timedelta(0))
    assert first.groups > 0
    r = api.post("/v1/groups", json={"groups": [make_group("later", answers=["1", "2"])]})
    assert r.status_code == 201
    with Session(engine) as s, s.begin():
        s.execute(text("UPDATE groups SET status = 'dropped' WHERE id = 'later'"))
    second = archive.archive(engine, str(tmp_path / "real"), timedelta(0))
    assert second.groups == 1 and second.orphans_removed == 0
    with Session(engine) as s:
        recorded = list(s.execute(select(ArchiveFile.location)).scalars())
    assert len(recorded) == first.files + second.files and all(Path(loc).exists() for loc in recorded)
    assert all(loc.startswith(str((tmp_path / "real").resolve())) for loc in recorded)  # real paths recorded
    assert Path(api.get("/v1/groups/a-1").json()["archive"]["location"]).exists()
    rows = api.get("/v1/export", params={"format": "rollouts", "include_archived": "true",
                                         "status": list(archive.FINAL_STATUSES)})
    assert rows.status_code == 200 and "later" in rows.text and "a-1" in rows.text


def test_two_databases_archiving_to_one_target_keep_each_others_files(seeded, fresh_db: str, make_db,
                                                                        tmp_path: Path) -> None:
    """Two runs (databases) archive to the same directory: names carry each database's archive id, so
    neither overwrites nor deletes the other's files; each reads back exactly its own groups."""
    from service.store.db import dispose_engine
    from tests.conftest import committing_client

    other_db = make_db()
    try:
        with committing_client(other_db) as other:
            _seed(other)  # the same group ids and pks in another database
            e1, e2 = get_engine(fresh_db), get_engine(other_db)
            assert _owner(e1) != _owner(e2)
            r1 = archive.archive(e1, str(tmp_path), timedelta(0))
            r2 = archive.archive(e2, str(tmp_path), timedelta(0))
            again = archive.archive(e1, str(tmp_path), timedelta(0))
            assert r1.groups == r2.groups > 0 and r2.orphans_removed == again.orphans_removed == 0
            assert not set(r1.locations) & set(r2.locations)
            assert all(Path(loc).exists() for loc in r1.locations + r2.locations)
            for api in (seeded, other):
                loc = api.get("/v1/groups/a-1").json()["archive"]["location"]
                assert set(pl.read_parquet(loc)["group_id"]) <= {"a-1", "a-2", "a-zero"}
                rows = list(archive.archived_rows(api.factory, dataset=None, statuses=list(archive.FINAL_STATUSES),
                                                  min_policy_version=None, max_policy_version=None))
                assert len(rows) == r1.trajectories
    finally:
        dispose_engine(other_db)


def test_a_write_killed_midway_leaves_readers_working(seeded, fresh_db: str, tmp_path: Path) -> None:
    """kill -9 between writing a file's temporary copy and renaming it into place: the temporary file is
    outside the Hive tree, so polars still reads the archive (a directory, or a **/*.parquet glob); the next
    run removes it."""
    engine = get_engine(fresh_db)
    first = archive.archive(engine, str(tmp_path), timedelta(0))
    before = pl.read_parquet(tmp_path / "all", hive_partitioning=True).height
    target = Path(first.locations[0])
    code = ("import os, sys, pyarrow as pa\n"
            "from service.archive import files\n"
            "os.replace = lambda *a: os._exit(9)  # the kill, right before the rename\n"
            f"t = files.Target.parse({str(tmp_path)!r}, {_owner(engine)!r})\n"
            f"t.write({str(target.parent / 'part-next.parquet')!r}, files.table([]))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parents[3])
    assert p.returncode == 9, p.stderr
    assert [x.name for x in target.parent.iterdir()] == [target.name]  # nothing beside the files
    assert len(list((tmp_path / "_tmp").iterdir())) == 1
    assert pl.read_parquet(tmp_path / "all", hive_partitioning=True).height == before
    assert pl.read_parquet(f"{tmp_path}/**/*.parquet").height >= before
    assert archive.archive(engine, str(tmp_path), timedelta(0)).orphans_removed == 1
    assert not list((tmp_path / "_tmp").iterdir())


@pytest.fixture
def fake_s3(monkeypatch) -> Iterator[str]:
    """moto's S3 server (the fake for S3, speaking its HTTP API) on a free port; yields host:port."""
    pytest.importorskip("moto", reason="moto[server] is the S3 fake: pip install -e '.[dev]'")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_EC2_METADATA_DISABLED", "true")):
        monkeypatch.setenv(name, value)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/moto-api/", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def test_round_trip_s3(seeded, fresh_db: str, fake_s3: str) -> None:
    engine = get_engine(fresh_db)
    s3 = pafs.S3FileSystem(endpoint_override=fake_s3, scheme="http", region="us-east-1",
                           allow_bucket_creation=True)
    s3.create_dir("arch")  # the bucket
    url = f"s3://arch/grpo?endpoint_override={fake_s3}&scheme=http&region=us-east-1"
    final = _final_ids(engine)
    before = _hot(engine, final)
    result = archive.archive(engine, url, timedelta(0))
    assert result.groups == len(final) and set(_statuses(engine)) == {"a-hot"}
    keys = [i.path for i in s3.get_file_info(pafs.FileSelector("arch/grpo/all", recursive=True))
            if i.type == pafs.FileType.File]
    assert keys and all("/dataset=" in k and "/date=" in k for k in keys)
    frames = []
    for key in keys:
        with s3.open_input_file(key) as f:
            frames.append(pl.read_parquet(f))
    _check_read_back(pl.concat(frames), before)
    r = seeded.get("/v1/groups/a-2")
    assert r.status_code == 200 and r.json()["archive"]["location"].startswith("s3://arch/grpo/all/dataset=toy/")
    # the export opens the recorded objects with the same options
    monkeypatch_rows = list(archive.archived_rows(seeded.factory, dataset=None, statuses=list(archive.FINAL_STATUSES),
                                                  min_policy_version=None, max_policy_version=None))
    assert len(monkeypatch_rows) == len(before)


def test_cli_archive_refuses_bad_options(fresh_db: str, tmp_path: Path) -> None:
    env = {**os.environ, "DATABASE_URL": fresh_db}
    for args, field in ((["--older-than", "7"], "--older-than"), (["--to", "ftp://x"], "--to"), ([], "--to")):
        if "--to" not in args:
            args = [*args, "--to", str(tmp_path)] if field != "--to" else args
        p = subprocess.run([sys.executable, "-m", "service.cli", "archive", *args], env=env, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode != 0 and field in p.stderr, (args, p.stderr)


def test_tombstones_match_deleted_rows(seeded, fresh_db: str, tmp_path: Path) -> None:
    engine = get_engine(fresh_db)
    final = _final_ids(engine)
    archive.archive(engine, str(tmp_path), timedelta(0))
    with Session(engine) as s:
        assert sorted(s.execute(select(GroupTombstone.id)).scalars()) == final
        # a-hot's: the archived groups' rows stay in their partition, unreachable, until it is dropped whole
        # (tests/service/store/test_partitions.py); every read goes through a live group
        assert s.execute(select(func.count()).select_from(Trajectory).join(Group, Group.pk == Trajectory.group_pk)
                         ).scalar_one() == 2


def test_worker_schedule_archives_with_archive_url(fresh_api, fresh_db: str, tmp_path: Path) -> None:
    """GRPO_CURATOR_ARCHIVE_URL + GRPO_CURATOR_RETENTION: the worker's archive thread moves final groups."""
    import threading

    from service.settings import Settings

    api, engine = fresh_api, get_engine(fresh_db)
    r = api.post("/v1/groups", json={"groups": [make_group("w-1", answers=["1", "2"]), make_group("w-2")]})
    assert r.status_code == 201
    leave_the_window(api)
    with Session(engine) as s, s.begin():
        s.execute(text("UPDATE groups SET status = 'dropped' WHERE id = 'w-1'"))
    settings = Settings(archive_url=str(tmp_path), retention="0s", archive_every_s=0.1)
    stop = threading.Event()
    thread = archive.start_schedule(engine, settings, stop)
    assert thread is not None and archive.start_schedule(engine, Settings(), stop) is None
    try:
        deadline = time.monotonic() + 60
        while "w-1" in _statuses(engine) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert _statuses(engine) == {"w-2": "received"}  # w-1 archived, the unfinished w-2 stays
    assert api.get("/v1/groups/w-1").json()["status"] == "archived"


def test_settings_refuse_a_bad_retention() -> None:
    from pydantic import ValidationError

    from service.settings import Settings

    with pytest.raises(ValidationError, match="retention"):
        Settings(retention="7 days")
    assert archive.parse_duration("7d") == timedelta(days=7) and archive.parse_duration("0s") == timedelta(0)
    with pytest.raises(ValueError, match="--older-than"):
        archive.parse_duration("-1d")


@pytest.mark.parametrize("retention", ["99999999999999999999d", "36501d", "1" + "0" * 400 + "s"])
def test_settings_refuse_a_retention_out_of_range(retention: str) -> None:
    """A duration too long for the archiver's cutoff (it overflowed inside the worker's archive thread, killing
    it) is refused when the settings load, naming the setting."""
    from pydantic import ValidationError

    from service.settings import Settings

    with pytest.raises(ValidationError, match="GRPO_CURATOR_RETENTION"):
        Settings(retention=retention)
    with pytest.raises(ValueError, match="--older-than"):
        archive.parse_duration(retention)
    assert Settings(retention="36500d").retention == "36500d"


def test_repost_while_the_archiver_commits_is_answered_by_the_tombstone(fresh_api, fresh_db: str,
                                                                        tmp_path: Path) -> None:
    """A re-post of a group's id that waits on the archiver's transaction (its row locked and deleted) must not
    store the group again once the archiver commits: the tombstone answers it."""
    import threading
    from datetime import UTC, datetime

    from service.archive import files
    from service.archive import repository as repo

    api, engine = fresh_api, get_engine(fresh_db)
    body = make_group("race-1", answers=["1", "2"])
    assert api.post("/v1/groups", json=body).status_code == 201
    with Session(engine) as s, s.begin():
        s.execute(text("UPDATE groups SET status = 'dropped'"))
    with Session(engine) as s, s.begin():
        due = repo.due_groups(s, datetime.now(UTC), 0, 10, below_version=1000)
        rows = repo.group_rows(s, [d[0] for d in due])
        owner = repo.identity(s)
    written = archive._write_batch(files.Target.parse(str(tmp_path), owner), rows, archive._partitions(due))
    answers: list[int] = []
    with Session(engine) as s:
        with s.begin():
            expected = archive.fingerprints([d[0] for d in due], [(r["group_pk"], r["content_md5"]) for r in rows])
            assert archive._record(s, expected, written)  # deleted, not committed yet
            poster = threading.Thread(target=lambda: answers.append(api.post("/v1/groups", json=body).status_code))
            poster.start()
            poster.join(timeout=2)
            assert poster.is_alive()  # the insert waits for the archiver's transaction
        poster.join(timeout=60)
    assert answers == [200]
    assert "race-1" not in _statuses(engine)
    with Session(engine) as s:
        assert s.execute(select(GroupTombstone.status).where(GroupTombstone.id == "race-1")).scalar_one() == "dropped"
    assert api.post("/v1/groups", json={**body, "policy_version": 5}).status_code == 409
