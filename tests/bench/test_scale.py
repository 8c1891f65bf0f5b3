"""bench/scale.py at a tiny size: two checkpoints run end to end against the real service (ingest through
the API and by COPY, lease by 1 and 4 trainers, /v1/stats, the archive command, the lease profile), the JSON
has its shape, and the counts are the bench's own writes; its private database is gone afterwards."""

from __future__ import annotations

import json

import pytest

from bench import scale
from tests.bench.databases import databases


@pytest.mark.slow
def test_two_checkpoints_measure_everything_and_leave_no_database(server_url, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DATABASE_URL", server_url)
    before = databases(server_url, "scale")
    argv = ["--sizes", "400", "800", "--batch", "16", "--batches", "2", "--ingest-groups", "4",
            "--stats-requests", "4", "--archive-groups", "5", "--profile", "--out", str(tmp_path)]
    assert scale.main(argv) == 0
    assert databases(server_url, "scale") == before
    body = json.loads((tmp_path / "scale.json").read_text())
    assert body["per_group"] == 8 and body["config"]["tokens"] == 64
    rows = body["checkpoints"]
    assert [r["size"] for r in rows] == [400, 800]
    for n, r in enumerate(rows, start=1):
        # per checkpoint: 50 groups loaded, 4 posted to the API one a request, 4 in one batch and 4 in one Arrow
        # batch, 4 by COPY, 5 archived
        assert r["db"]["groups"] == 61 * n
        assert r["db"]["trajectories"] == 8 * r["db"]["groups"]
        assert r["db"]["stats_cells"] > 0
        for side in ("ingest_api", "ingest_api_batch", "ingest_api_arrow", "ingest_copy"):
            assert r[side]["groups_per_s"] > 0, side
        assert r["ingest_ratio_batch"] == r["ingest_api_batch"]["groups_per_s"] / r["ingest_copy"]["groups_per_s"]
        assert r["ingest_ratio_arrow"] == r["ingest_api_arrow"]["groups_per_s"] / r["ingest_copy"]["groups_per_s"]
        for trainers in ("1", "4"):
            lease = r["lease"][trainers]
            assert lease["batches"] == 2 * int(trainers)
            assert 0 < lease["p50_ms"] <= lease["p99_ms"]
        assert 0 < r["stats"]["p50_ms"] <= r["stats"]["p99_ms"]
        assert r["archive"]["groups"] == 5 and r["archive"]["parquet_mb"] > 0
        profile = r["profile"]
        assert profile["orm_statements"] >= 3 and profile["lease_once_p50_ms"] > 0
        assert profile["encode_arrow_p50_ms"] > 0 and profile["rows_sql_p50_ms"] > 0
    printed = capsys.readouterr().out
    assert "targets:" in printed and "profile at 800" in printed


def test_bad_sizes_are_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        scale.main(["--sizes", "1000", "100"])
    assert exc.value.code == 2 and "--sizes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        scale.main(["--tokens", "16"])
    assert "--tokens" in capsys.readouterr().err
