"""kill -9 of the archiver (a real ``grpo-curator archive`` process) at random points, over many small cycles:
after every kill each group is exactly once hot or archived (never neither, never both), every archived group
is in exactly one recorded file, complete; a final clean run leaves every group in exactly one file on disk.

Each archiver is its own process running the CLI's ``main`` (its own environment, pipes, exit status, killed
by SIGKILL), forked from a zygote that imported the CLI once (tests/forked_cli.py): a ``python -m service.cli``
start spent ~2 s in imports before its first line, and every kill lands after that line."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from service.store.db import get_engine
from service.store.models import ArchiveFile, Group, GroupTombstone
from tests.conftest import ROOT
from tests.forked_cli import ForkedProcess, Zygote
from tests.helpers import make_group

CYCLES = 20
GROUPS_PER_CYCLE = 3


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    with Zygote(cwd=str(ROOT)) as z:
        yield z


def _archiver(zygote: Zygote, db: str, to: Path) -> ForkedProcess:
    env = {**os.environ, "DATABASE_URL": db, "GRPO_CURATOR_LOG_LEVEL": "warning"}
    return zygote.spawn(["archive", "--to", str(to), "--older-than", "0s", "--batch", "1"], env)


def _started(proc: ForkedProcess) -> None:
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert line.startswith("archiving to"), (line, proc.stderr.read())  # type: ignore[union-attr]


def _post_final(api, engine, cycle: int, rng: random.Random) -> dict[str, int]:
    """Post a cycle's groups and move them to a final status (test setup: the pipeline is tested elsewhere)."""
    groups = [make_group(f"k{cycle}-{i}", prompt_id="p-1", answers=[str(rng.randrange(50)) for _ in range(rng.randint(1, 3))])
              for i in range(GROUPS_PER_CYCLE)]
    assert api.post("/v1/groups", json={"groups": groups}).status_code == 201
    with Session(engine) as s, s.begin():
        for i, g in enumerate(groups):
            status = ("consumed", "dropped", "reward_error", "curation_error")[(cycle + i) % 4]
            s.execute(text("UPDATE groups SET status = :s WHERE id = :id"), {"s": status, "id": g["id"]})
    return {g["id"]: len(g["trajectories"]) for g in groups}


def _check(engine, posted: dict[str, int]) -> int:
    """The invariant after a kill; returns how many groups are archived."""
    with Session(engine) as s:
        hot = set(s.execute(select(Group.id)).scalars())
        tombs = dict(s.execute(select(GroupTombstone.id, ArchiveFile.location)
                               .join(ArchiveFile, ArchiveFile.pk == GroupTombstone.file_pk)).all())
        recorded = list(s.execute(select(ArchiveFile.location).where(ArchiveFile.kind == "all")).scalars())
    assert not hot & set(tombs), "a group both hot and archived"
    assert hot | set(tombs) == set(posted), "a group neither hot nor archived"
    if recorded:
        df = pl.concat([pl.read_parquet(loc).with_columns(pl.lit(loc).alias("file")) for loc in recorded])
        counts = df.group_by("group_id").agg(pl.len().alias("n"), pl.col("file").n_unique().alias("files"))
        seen = {r["group_id"]: (r["n"], r["files"]) for r in counts.iter_rows(named=True)}
    else:
        seen = {}
    assert set(seen) == set(tombs), "recorded files hold exactly the archived groups"
    for gid, (n, nfiles) in seen.items():
        assert (n, nfiles) == (posted[gid], 1), gid
        assert Path(tombs[gid]).exists()
    return len(tombs)


def _recorded(engine) -> int:
    with Session(engine) as s:
        return len(list(s.execute(select(ArchiveFile.pk)).scalars()))


def test_kill_9_mid_archive_leaves_each_group_hot_or_archived(fresh_api, fresh_db: str, tmp_path: Path,
                                                              zygote: Zygote) -> None:
    api, engine, rng = fresh_api, get_engine(fresh_db), random.Random(27)
    to = tmp_path / "archive"
    posted: dict[str, int] = {}
    assert api.post("/v1/policy", json={"version": 1000, "metrics": {}}).status_code == 201  # past the alert window
    # calibrate: one full run of a cycle's groups, so the kills land anywhere inside a run
    posted |= _post_final(api, engine, 0, rng)
    proc = _archiver(zygote, fresh_db, to)
    _started(proc)
    t0 = time.monotonic()
    assert proc.wait(timeout=60) == 0, proc.stderr.read()  # type: ignore[union-attr]
    span = max(time.monotonic() - t0, 0.02)
    assert _check(engine, posted) == len(posted)
    killed_mid = orphans = 0
    for cycle in range(1, CYCLES + 1):
        posted |= _post_final(api, engine, cycle, rng)
        proc = _archiver(zygote, fresh_db, to)
        _started(proc)
        time.sleep(rng.uniform(0, span))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
        archived = _check(engine, posted)
        killed_mid += archived < len(posted)
        orphans += len([p for p in to.rglob("*.parquet")]) > _recorded(engine) or any((to / "_tmp").glob("*"))
    assert killed_mid > 0  # some kills did land before the run ended
    proc = _archiver(zygote, fresh_db, to)
    _started(proc)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()  # type: ignore[union-attr]
    print(f"archiver kills (within {span:.2f} s of the first line): {killed_mid}/{CYCLES} before the run ended, "
          f"{orphans} left an unrecorded file; "
          f"last run: {proc.stdout.read().strip()}")  # type: ignore[union-attr]
    assert _check(engine, posted) == len(posted)
    # on disk too (not only the recorded files): every group exactly once, no temporary file left
    on_disk = pl.read_parquet(to / "all", hive_partitioning=True)
    assert on_disk.group_by("group_id").len().sort("group_id").rows() == sorted(posted.items())
    assert not list((to / "_tmp").iterdir())
    assert all(p.suffix == ".parquet" for p in (to / "all").rglob("*") if p.is_file())  # nothing else in the tree
