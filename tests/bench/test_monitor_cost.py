"""bench/monitor_cost.py at a tiny size: two checkpoints load, enrich and publish, then time worker passes
without and with the monitors due and the monitors alone; the JSON has its shape, the passes did their
work (every received group curated), and the private database is gone afterwards."""

from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest

from bench import monitor_cost
from service.store.dbadmin import libpq_url
from tests.bench.databases import databases


@pytest.mark.slow
def test_two_checkpoints_time_every_mode_and_leave_no_database(server_url, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DATABASE_URL", server_url)
    before = databases(server_url, "moncost")
    argv = ["--sizes", "400", "800", "--passes", "2", "--batch", "3", "--out", str(tmp_path)]
    assert monitor_cost.main(argv) == 0
    assert databases(server_url, "moncost") == before
    body = json.loads((tmp_path / "monitor_cost.json").read_text())
    assert body["per_group"] == 8 and body["config"]["batch"] == 3
    rows = body["checkpoints"]
    assert [r["size"] for r in rows] == [400, 800]
    for n, r in enumerate(rows, start=1):
        # per checkpoint: 50 groups loaded, 2 x (2 + 1 warm-up) x 3 received through the API
        assert r["db"]["groups"] == (50 + 18) * n
        assert r["db"]["trajectories"] == 8 * r["db"]["groups"]
        for mode in ("worker", "worker+monitors"):
            m = r[mode]
            assert m["passes"] == 2 and 0 < m["p50_ms"] <= m["p99_ms"]
            # each timed pass claimed, scored and curated its 3 groups: none left half-way
            assert m["scored"] == 6 and m["ready"] + m["dropped"] == 6
            assert m["failed"] == 0 and m["curation_errors"] == 0
        assert r["monitors"]["passes"] == 2 and 0 < r["monitors"]["p50_ms"] <= r["monitors"]["p99_ms"]
        assert r["monitors"]["version"] == r["versions"] == 1  # 100 groups: inside the first 10,000-group version
        assert r["monitors"]["errors"] == 0 and r["worker+monitors"]["evaluate_failures"] == 0
        assert 0 < r["amortised_share"] < 1
    printed = capsys.readouterr().out
    assert "amortised" in printed and "+monitors" in printed


def test_loaded_history_carries_what_the_monitors_read(server_url):
    from service.store.dbadmin import create_database, drop_database
    from service.store.migrate import upgrade

    url = create_database(server_url, "moncost")
    try:
        upgrade(url)
        with psycopg.connect(libpq_url(url)) as conn:
            monitor_cost.scale.seed_prompts(conn)
        monitor_cost.scale.load(url, 1, 5, 32, np.random.default_rng(0))
        monitor_cost.enrich(url, 1, 5)
        assert monitor_cost.publish_versions(url, 3, np.random.default_rng(0)) == 3
        assert monitor_cost.publish_versions(url, 3, np.random.default_rng(0)) == 3  # nothing twice
        with psycopg.connect(libpq_url(url)) as conn:
            outcomes = conn.execute("SELECT count(*) FROM trajectories WHERE outcome = total_reward").fetchone()[0]
            rewards = conn.execute("SELECT count(*) FROM rewards WHERE kind = 'verifier.math'").fetchone()[0]
            metrics = [r[0] for r in conn.execute("SELECT metrics FROM policy_versions ORDER BY version")]
        assert outcomes == 40 and rewards == 40
        assert len(metrics) == 3 and all(set(m) == set(monitor_cost.METRICS) for m in metrics)
    finally:
        drop_database(server_url, url)


def test_bad_flags_are_refused_naming_the_flag(capsys):
    for argv, flag in ((["--sizes", "1000", "100"], "--sizes"), (["--tokens", "16"], "--tokens"),
                       (["--batch", "0"], "--batch"), (["--passes", "0"], "--passes")):
        with pytest.raises(SystemExit) as exc:
            monitor_cost.main(argv)
        assert exc.value.code == 2 and flag in capsys.readouterr().err
